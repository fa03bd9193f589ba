"""@triton.jit building blocks shared by the SISO and MIMO chunk kernels.

Contract: every helper works on one chunk of one (sequence, head): rows ``i = 0..C-1`` are the chunk's tokens
(``i < L`` valid; invalid rows load zeros so they contribute nothing). Everything is fp32.

* ``chunk_row``       the (batch row, first time index, length, end of sequence) of chunk ``c`` from the chunk
                      table (layout: ``common.chunking``).
* ``batch_strides``   the batch strides of a call's contiguous tensors, derived in-kernel from T.
* ``chunk_scalars``   a_t, dt_t, λ_t = σ(trap_t), γ_t = λ_t·dt_t, scale_t = γ_t + dt_{t+1}(1−λ_{t+1}) (0 when t is the
                      sequence's last token), and the within-chunk cumsum cs_t = Σ_{r≤t} a_r.
* ``chunk_coefficients``  γ, scale, cs and cs_last of a chunk loaded from the per-token table ``chunk_sums``
                      writes with ``chunk_scalars`` (the SISO chunk kernels: no scan or sigmoid per kernel and head).
* ``reverse_cumsum``  Σ_{s ≥ t} along a chunk's rows (the backward's within-chunk scan of the decay).
* ``head_angle_rows`` element offsets of rows (batch row, token, head) of a contiguous (B, T, H, A) tensor: the
                      sin/cos planes and the per-token dθ sums R of the backward share that layout.
* ``rotation_tile``   (sin θ, cos θ) of a chunk's rows and one N block's angle columns, loaded from the fp32 planes
                      that ``cumsum.rotation_planes`` computes once per call (θ, its cumsum and sin/cos are not
                      recomputed by every kernel and N block).
* ``fast_exp``, ``fast_sigmoid``  e^x and σ(x) by libdevice's flush-to-zero fast paths in compiled kernels (the
                      accuracy of tl.exp / tl.sigmoid in about a third of the instructions), tl.exp / tl.sigmoid
                      under the interpreter.
* ``tanh_sech2``      tanh and sech² of x through one sigmoid.
* ``wrap_angle``      θ mod 2π in [0, 2π).
* ``sincos``          sin and cos for moderate |x| (θ < 2π + a chunk's increments): quadrant reduction by π/2
                      (three-constant Cody–Waite) and degree-9/10 polynomials on [−π/4, π/4]; abs error ≈ 1e-7. Plain
                      arithmetic, so it runs in the interpreter and avoids libdevice's large sin/cos code (which
                      carries local-memory arrays for the huge-argument path and costs registers/occupancy).
* ``join_pairs``      (even, odd) C×K halves → the interleaved C×2K tile (adjacent pairs), for dot operands.
* ``split_pairs``     the inverse.
* ``split16``         an fp32 tile as hi + lo 16-bit tiles (hi = x rounded, lo = the rounded remainder): a dot of
                      hi·hi + hi·lo + lo·hi carries ~16 mantissa bits instead of 8 (bf16), on tensor cores.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

PI = tl.constexpr(3.141592653589793)
# True in compiled kernels, False under the interpreter (decided like @triton.jit decides to interpret), which
# has neither libdevice nor inline PTX. Compiled kernels take the flush-to-zero fast paths of exp and 1/x
# (``fast_exp``, ``fast_sigmoid``); the interpreter runs the plain ones.
COMPILED = tl.constexpr(not triton.knobs.runtime.interpret)


@triton.jit
def chunk_row(table_ptr, c):
    """Row ``c`` of the (nchunks, 5) int32 chunk table [bidx, t0, L, seq, t_end]: (bidx, t0, L, t_end), the
    token offsets widened to int64."""
    row = table_ptr + c * 5
    return (tl.load(row + 0).to(tl.int64), tl.load(row + 1).to(tl.int64), tl.load(row + 2),
            tl.load(row + 4).to(tl.int64))


@triton.jit
def batch_strides(T, H, sx_t, sy_t, sa_t):
    """Batch strides of one call's contiguous tensors, derived from T (passed with do_not_specialize) times a
    per-model stride so that their divisibility stays provable: two (B, T, ...) token-major tensors with token
    strides sx_t and sy_t, the (B, H, T) per-head scalars (head stride T, batch stride H·T) and the angle rows
    (token stride sa_t). Returns (sx_b, sy_b, s_h, s_b, sa_b)."""
    return T * sx_t, T * sy_t, T, H * T, T * sa_t


@triton.jit
def chunk_scalars(adt_ptr, dt_ptr, trap_ptr, base, t0, L, t_end, C: tl.constexpr):
    """Per-token trapezoid coefficients of one chunk; ``base`` points at (batch row, head) of (B, H, T) tensors."""
    i = tl.arange(0, C)
    m = i < L
    t = t0 + i
    a = tl.load(adt_ptr + base + t, mask=m, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + base + t, mask=m, other=0.0).to(tl.float32)
    lam = fast_sigmoid(tl.load(trap_ptr + base + t, mask=m, other=0.0).to(tl.float32))
    mn = (t + 1 < t_end) & m
    dtn = tl.load(dt_ptr + base + t + 1, mask=mn, other=0.0).to(tl.float32)
    lamn = fast_sigmoid(tl.load(trap_ptr + base + t + 1, mask=mn, other=0.0).to(tl.float32))
    gamma = lam * dt
    scale = gamma + dtn * (1.0 - lamn)
    cs = tl.cumsum(a, 0)
    return i, m, a, dt, lam, gamma, scale, cs


@triton.jit
def chunk_coefficients(coef_ptr, plane, base, t0, L, C: tl.constexpr):
    """(i, m, γ, scale, cs, cs_last) of one chunk, loaded from the per-token table that ``cumsum.chunk_sums``
    computes with ``chunk_scalars`` once per pass ((3, B, H, T) fp32: planes cs, γ, scale, ``plane`` apart;
    ``base`` points at (batch row, head)). Rows i ≥ L get γ = scale = 0 and cs = cs_last, as ``chunk_scalars``
    gives them."""
    i = tl.arange(0, C)
    m = i < L
    row = coef_ptr + base + t0
    cs_last = tl.load(row + L - 1)
    cs = tl.where(m, tl.load(row + i, mask=m, other=0.0), cs_last)
    gamma = tl.load(row + plane + i, mask=m, other=0.0)
    scale = tl.load(row + 2 * plane + i, mask=m, other=0.0)
    return i, m, gamma, scale, cs, cs_last


@triton.jit
def coefficient_loads(coef_ptr, plane, base, t0, L, C: tl.constexpr):
    """The loads of :func:`chunk_coefficients` without its select: (cs_last, cs with 0 in rows i ≥ L, γ, scale), for
    a walk over chunks that issues them a chunk ahead of their use (``SisoConfig.scan_prefetch``). chunk_coefficients
    keeps its own loads: built on this function, its select moved after the last load and the SASS of every kernel
    using it changed (sm_90, forty-eighth session)."""
    i = tl.arange(0, C)
    m = i < L
    row = coef_ptr + base + t0
    return (tl.load(row + L - 1), tl.load(row + i, mask=m, other=0.0), tl.load(row + plane + i, mask=m, other=0.0),
            tl.load(row + 2 * plane + i, mask=m, other=0.0))


@triton.jit
def walk_chunk(first, n, jj, REVERSE: tl.constexpr):
    """The chunk at step jj of a walk over a sequence's n ≥ 1 chunks from chunk ``first`` (REVERSE: from its last);
    steps past the end give the walk's last chunk (for loads a step ahead: ``SisoConfig.scan_prefetch``)."""
    jj = tl.minimum(jj, n - 1)
    if REVERSE:
        return first + n - 1 - jj
    else:
        return first + jj


@triton.jit
def reverse_cumsum(x):
    """Σ_{s ≥ t} x_s along axis 0 of a chunk's rows (the inclusive reverse cumsum), as total − cumsum + x."""
    return tl.sum(x, 0, keep_dims=True) - tl.cumsum(x, 0) + x


@triton.jit
def fast_exp(x):
    """e^x in fp32 as ex2.approx.ftz(x·log₂e): the accuracy of tl.exp (≈ 2 ulp) without its handling of
    subnormal results (flushed to 0), which costs three more instructions per element (sm_90 SASS)."""
    if COMPILED:
        return libdevice.fast_expf(x)
    else:
        return tl.exp(x)


@triton.jit
def fast_sigmoid(x):
    """σ(x) = 1/(1 + e^{−x}) with ``fast_exp`` and the approximate division (≈ 2 ulp; 0 once 1 + e^{−x} > 2^126,
    where σ < 1e-38): 4 instructions per element where tl.sigmoid (full-range division, subnormal-safe exp)
    takes about 12."""
    if COMPILED:
        return libdevice.fast_dividef(tl.full(x.shape, 1.0, tl.float32), 1.0 + libdevice.fast_expf(-x))
    else:
        return tl.sigmoid(x)


@triton.jit
def tanh_sech2(x):
    s = fast_sigmoid(2.0 * x)
    return 2.0 * s - 1.0, 4.0 * s * (1.0 - s)


@triton.jit
def sincos(x):
    k = tl.floor(x * 0.6366197723675814 + 0.5)  # nearest multiple of π/2
    # π/2 = 1.5703125 + 4.837512969970703125e-4 + 7.549789954891882e-8 (Cody–Waite: k·c exact for small k)
    r = x - k * 1.5703125
    r = r - k * 4.837512969970703125e-4
    r = r - k * 7.549789954891882e-8
    r2 = r * r
    s = r + r * r2 * (-1.6666666666666666e-01 + r2 * (8.333333333333333e-03 + r2 * (
        -1.984126984126984e-04 + r2 * (2.7557319223985893e-06 + r2 * -2.505210838544172e-08))))
    c = 1.0 + r2 * (-0.5 + r2 * (4.1666666666666664e-02 + r2 * (-1.388888888888889e-03 + r2 * (
        2.48015873015873e-05 + r2 * -2.755731922398589e-07))))
    q = k - 4.0 * tl.floor(k * 0.25)  # quadrant 0..3
    sn = tl.where(q == 0.0, s, tl.where(q == 1.0, c, tl.where(q == 2.0, -s, -c)))
    cn = tl.where(q == 0.0, c, tl.where(q == 1.0, -s, tl.where(q == 2.0, -c, s)))
    return sn, cn


TWO_PI = tl.constexpr(6.283185307179586)


@triton.jit
def wrap_angle(th):
    """θ mod 2π in [0, 2π) (the two selects fix rounding at the ends)."""
    th = th - TWO_PI * tl.floor(th * (1.0 / TWO_PI))
    th = tl.where(th < 0.0, th + TWO_PI, th)
    return tl.where(th >= TWO_PI, th - TWO_PI, th)


@triton.jit
def head_angle_rows(bidx, t, h, T, H, A):
    """((bidx·T + t)·H + h)·A: offsets of rows of a contiguous (B, T, H, A) tensor (``t`` (C,) int64 tokens)."""
    return ((bidx * T + t) * H + h) * A


@triton.jit
def rotation_tile(rot_ptr, plane, row, m, pa, A, C: tl.constexpr, BH: tl.constexpr):
    """(sin θ, cos θ) [C, BH] for the angle columns ``pa`` of one N block, read from the precomputed planes
    (``cumsum.rotation_planes``: sin at ``rot_ptr``, cos at ``rot_ptr + plane``; ``row``: (C,) element offsets of
    the tokens' (head) rows). Columns ≥ A are (0, 1): no rotation; blocks past the A rotated pairs load nothing."""
    if tl.min(pa, 0) < A:
        mm = m[:, None] & (pa < A)[None, :]
        ptr = rot_ptr + row[:, None] + pa[None, :]
        si = tl.load(ptr, mask=mm, other=0.0)
        co = tl.load(ptr + plane, mask=mm, other=1.0)
    else:
        si = tl.zeros([C, BH], dtype=tl.float32)
        co = tl.full([C, BH], 1.0, dtype=tl.float32)
    return si, co


@triton.jit
def load_pairs(ptr, row, m, n0, C: tl.constexpr, BN: tl.constexpr, STRIDED: tl.constexpr):
    """Rows ``row`` (C,) of a [*, N] tensor, dims n0..n0+BN, as (even, odd) C×BN/2 fp32 halves. STRIDED: two
    stride-2 loads (the halves never pass through a reshape/split: they feed tensor-core dots directly, see
    ``siso/configs.py``); else one contiguous (vectorised) load split in registers."""
    if STRIDED:
        ne = n0 + 2 * tl.arange(0, BN // 2)
        pe = ptr + row[:, None] + ne[None, :]
        return (tl.load(pe, mask=m[:, None], other=0.0).to(tl.float32),
                tl.load(pe + 1, mask=m[:, None], other=0.0).to(tl.float32))
    else:
        n = n0 + tl.arange(0, BN)
        x = tl.load(ptr + row[:, None] + n[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        return tl.split(tl.reshape(x, (C, BN // 2, 2)))


@triton.jit
def add_bias_pairs(e, o, ptr, n0, BN: tl.constexpr, STRIDED: tl.constexpr):
    """(even, odd) halves from load_pairs plus the bias dims n0..n0+BN at ``ptr`` (one head's N biases)."""
    if STRIDED:
        ne = n0 + 2 * tl.arange(0, BN // 2)
        be = tl.load(ptr + ne).to(tl.float32)
        bo = tl.load(ptr + ne + 1).to(tl.float32)
    else:
        x = tl.load(ptr + n0 + tl.arange(0, BN)).to(tl.float32)
        be, bo = tl.split(tl.reshape(x, (BN // 2, 2)))
    return e + be[None, :], o + bo[None, :]


@triton.jit
def store_pairs(ptr, row, m, n0, e, o, C: tl.constexpr, BN: tl.constexpr, STRIDED: tl.constexpr):
    """The inverse of :func:`load_pairs`: (even, odd) C×BN/2 halves into rows ``row`` (C,), dims n0..n0+BN. STRIDED:
    two stride-2 stores; else one re-interleaved (vectorised) tile (a stride-2 store fills a quarter of each 32-byte
    sector per thread: Nsight Compute, the SISO fp32 chunk states on the H100, 4.0 of 32 bytes)."""
    if STRIDED:
        ne = n0 + 2 * tl.arange(0, BN // 2)
        pe = ptr + row[:, None] + ne[None, :]
        tl.store(pe, e.to(ptr.dtype.element_ty), mask=m[:, None])
        tl.store(pe + 1, o.to(ptr.dtype.element_ty), mask=m[:, None])
    else:
        n = n0 + tl.arange(0, BN)
        x = tl.reshape(tl.join(e, o), (C, BN))
        tl.store(ptr + row[:, None] + n[None, :], x.to(ptr.dtype.element_ty), mask=m[:, None])


@triton.jit
def join_pairs(e, o, R: tl.constexpr, K2: tl.constexpr):
    return tl.reshape(tl.join(e, o), (R, K2))


@triton.jit
def split_pairs(x, R: tl.constexpr, K: tl.constexpr):
    return tl.split(tl.reshape(x, (R, K, 2)))


@triton.jit
def split16(x, DT: tl.constexpr):
    hi = x.to(DT)
    return hi, (x - hi.to(tl.float32)).to(DT)
