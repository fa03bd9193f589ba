"""Triton kernels of the one-token decode step (SISO and MIMO), states updated in place.

The state is read and written once; everything else is small. A step never lets one program read a value another
program may already have overwritten:

* ``mamba3_step_kernel`` — grid (row-tile group, head, batch row). With whole state rows per tile (BLOCK_N ≥ N) a
  program computes θ', q̃_r, k̃_r and loads the previous k̃_r once (in registers, tuples over r), then streams
  ROW_TILES tiles of BLOCK_P rows of the fp32 (P × N) state, the next tile and its rows' v, v_prev, z and ψ_r
  prefetched, updating each in place and finishing its rows' outputs (D, RMSNorm over P, gate, rank contraction).
  When one program holds all of P (WRITE_SMALL) it alone has read the old θ, k̃ and v of its (row, head), so it
  writes the new ones itself after a barrier: one launch. With N in several tiles (BLOCK_N < N: large N with many
  ranks) a program holds one row tile and streams its pair blocks, the next one prefetched, q̃/k̃ computed per
  block.
* ``mamba3_step_rows_kernel`` — grid (head, batch row), after the state kernel when several programs share a
  (row, head): writes θ', k̃ and v. It reads the old θ before overwriting it (a barrier between, as above).

Grids run a head's row tiles fastest, then heads, then batch rows, so that consecutive programs stream
neighbouring parts of the (B, H, P, N) state: with the batch row fastest (programs 2 MB apart), the SISO step took
0.152 ms at batch 128 on the H200, 0.141 in this order (tenth session).

One launch with the last of a (row, head)'s programs to finish (an acquire-release atomic count) writing θ', k̃
and v was measured slower on the H200 (SISO 5.38 / 13.2 / 161 µs against 5.07 / 9.5 / 154 µs at batch 1, 8, 128):
the last arriver's serial tail costs more than the second launch saves.

Rotation: pair j of x is rotated by θ_j as (lo, hi) → (lo·cos − hi·sin, lo·sin + hi·cos), where
  adjacent pairs (SISO): lo = x[2j], hi = x[2j + 1] (a contiguous run, split in registers);
  half split (MIMO):     lo = x[j],  hi = x[N/2 + j] (two half-row loads);
pairs j ≥ A pass through. Every tile and vector is held as its (lo, hi) halves, so a pair is rotated in one thread
by one angle with no partner loads. All kernels compute θ' with the same helper from the old angle state, so the
angles used for q̃/k̃ and the stored θ' agree bit for bit.

The state's row stride is a compile-time constant (N for every cache this package allocates): the rows of a
tile are then one base address plus immediate offsets, where a runtime stride kept a 64-bit address per row live
from the load to the store (AOT sm_90, SISO 16 × 128 tile: 168 → 128 registers; MIMO R = 4 on the H200:
0.272 → 0.254 ms).

Lane sums (MIMO, R = 2 or 4, 8 × 128 tiles in one warp; ``StepConfig.lane_sums``): y_r = h'q̃_r needs, per tile, the
sums of 4R values per lane (R ranks × the lane's 4 rows) over the 16 lanes of a row; reduced one value at a time
(Triton's tl.sum) that is 4R × 4 shuffles and adds. ``_lane_partials`` forms each lane's partial sums (one FMA
chain over its 4 columns) as (2 × 16) tensors whose element (g, c) is lane 16g + c, and inline PTX
(``_LANE_SUM_PTX_R2`` / ``_R4``) reduces and scatters them: a butterfly in which each level halves the values a lane
keeps (4R − 1 shuffles), so that lane c ends with the total of value c // (16 / 4R); ``_finish_rows_lanes`` then
works on one (row, rank) per lane. The PTX depends on that lane order, which the AOT lane checks in the compiled IR
(tests/aot/test_step_lane_sums.py); the interpreter runs the plain reductions (the same sums in another order).

Everything is computed in fp32 whatever the input dtype; states are loaded and stored in their own dtype.
No host synchronisation, no data-dependent allocation: the launches are CUDA-graph capturable, and
``state_batch_indices`` (loaded in the kernels) may change between graph replays. A negative index skips the
row (output zeros, states untouched), like a padded slot in a serving engine.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.tiles import COMPILED, PI, sincos, wrap_angle


@triton.jit
def _new_angle(sa_row, ang_row, j, mask, dt):
    """θ'_j = (θ_j + π·tanh(φ_j)·dt) mod 2π from the old angle state row and the angle rates row. tanh is
    2σ(2x) − 1 with tl.sigmoid, not the chunk kernels' fast_sigmoid: the step is bandwidth-bound, and with the
    fast path the pooled (state_batch_indices) and dense variants of the kernel stopped agreeing bit for bit."""
    th = tl.load(sa_row + j, mask=mask, other=0.0).to(tl.float32)
    tanh_rate = 2.0 * tl.sigmoid(2.0 * tl.load(ang_row + j, mask=mask, other=0.0).to(tl.float32)) - 1.0
    return wrap_angle(th + PI * tanh_rate * dt)


@triton.jit
def _rank_scales(mv_h, pp, pmask, P, R: tl.constexpr, HAS_PSI: tl.constexpr):
    """ψ_r of the rows pp (MIMO_V), a tuple over r; empty without it."""
    psi = ()
    if HAS_PSI:
        for r in tl.static_range(R):
            psi = psi + (tl.load(mv_h + r * P + pp, mask=pmask, other=0.0).to(tl.float32),)
    return psi


@triton.jit
def _load_pairs(ptr, j0, HALF: tl.constexpr, N: tl.constexpr, ADJACENT: tl.constexpr):
    """(x[lo], x[hi]) in fp32 of the pairs [j0, j0 + HALF) of an N-vector (zeros past its end): adjacent pairs are
    the columns (2j, 2j + 1), loaded as one run and split in registers; half-split pairs (j, N/2 + j)."""
    if ADJACENT:
        nn = 2 * j0 + tl.arange(0, 2 * HALF)
        x = tl.load(ptr + nn, mask=nn < N, other=0.0).to(tl.float32)
        lo, hi = tl.split(tl.reshape(x, (HALF, 2)))
    else:
        jj = j0 + tl.arange(0, HALF)
        jmask = jj < N // 2
        lo = tl.load(ptr + jj, mask=jmask, other=0.0).to(tl.float32)
        hi = tl.load(ptr + N // 2 + jj, mask=jmask, other=0.0).to(tl.float32)
    return lo, hi


@triton.jit
def _store_pairs(ptr, j0, lo, hi, HALF: tl.constexpr, N: tl.constexpr, ADJACENT: tl.constexpr):
    """The inverse of _load_pairs."""
    ety = ptr.dtype.element_ty
    if ADJACENT:
        nn = 2 * j0 + tl.arange(0, 2 * HALF)
        tl.store(ptr + nn, tl.reshape(tl.join(lo, hi), (2 * HALF,)).to(ety), mask=nn < N)
    else:
        jj = j0 + tl.arange(0, HALF)
        jmask = jj < N // 2
        tl.store(ptr + jj, lo.to(ety), mask=jmask)
        tl.store(ptr + N // 2 + jj, hi.to(ety), mask=jmask)


@triton.jit
def _load_pair_tile(row_ptr, pp, pmask, j0, HALF: tl.constexpr, N: tl.constexpr, ROW_STRIDE: tl.constexpr,
                    ADJACENT: tl.constexpr):
    """_load_pairs for the state rows pp: (lo, hi) tiles of len(pp) × HALF, streamed (evict first). A j0 past the
    last pair block loads nothing (the prefetch after the last tile)."""
    if ADJACENT:
        nn = 2 * j0 + tl.arange(0, 2 * HALF)
        mask = pmask[:, None] & (nn < N)[None, :]
        x = tl.load(row_ptr + pp[:, None] * ROW_STRIDE + nn[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first")
        lo, hi = tl.split(tl.reshape(x, (x.shape[0], HALF, 2)))
    else:
        jj = j0 + tl.arange(0, HALF)
        mask = pmask[:, None] & (jj < N // 2)[None, :]
        ptr = row_ptr + pp[:, None] * ROW_STRIDE + jj[None, :]
        lo = tl.load(ptr, mask=mask, other=0.0, eviction_policy="evict_first")
        hi = tl.load(ptr + N // 2, mask=mask, other=0.0, eviction_policy="evict_first")
    return lo, hi


@triton.jit
def _store_pair_tile(row_ptr, pp, pmask, j0, lo, hi, HALF: tl.constexpr, N: tl.constexpr,
                     ROW_STRIDE: tl.constexpr, ADJACENT: tl.constexpr):
    """The inverse of _load_pair_tile."""
    ety = row_ptr.dtype.element_ty
    if ADJACENT:
        nn = 2 * j0 + tl.arange(0, 2 * HALF)
        mask = pmask[:, None] & (nn < N)[None, :]
        x = tl.reshape(tl.join(lo, hi), (lo.shape[0], 2 * HALF))
        tl.store(row_ptr + pp[:, None] * ROW_STRIDE + nn[None, :], x.to(ety), mask=mask,
                 eviction_policy="evict_first")
    else:
        jj = j0 + tl.arange(0, HALF)
        mask = pmask[:, None] & (jj < N // 2)[None, :]
        ptr = row_ptr + pp[:, None] * ROW_STRIDE + jj[None, :]
        tl.store(ptr, lo.to(ety), mask=mask, eviction_policy="evict_first")
        tl.store(ptr + N // 2, hi.to(ety), mask=mask, eviction_policy="evict_first")


@triton.jit
def _rotated_pair(x_ptr, b_ptr, j0, c, s, HALF: tl.constexpr, N: tl.constexpr, ADJACENT: tl.constexpr):
    """R(θ)(x + b) on the pairs [j0, j0 + HALF), as (lo, hi)."""
    x_lo, x_hi = _load_pairs(x_ptr, j0, HALF, N, ADJACENT)
    b_lo, b_hi = _load_pairs(b_ptr, j0, HALF, N, ADJACENT)
    x_lo += b_lo
    x_hi += b_hi
    return x_lo * c - x_hi * s, x_lo * s + x_hi * c


@triton.jit
def _pair_angles(sa_row, ang_row, j0, dt, A, HALF: tl.constexpr):
    """(θ', cos θ', sin θ') of the pairs [j0, j0 + HALF); pairs j ≥ A are not rotated (cos 1, sin 0)."""
    jj = j0 + tl.arange(0, HALF)
    rot = jj < A
    theta = _new_angle(sa_row, ang_row, jj, rot, dt)
    si, co = sincos(theta)   # θ' ∈ [0, 2π): the short polynomial suffices
    return theta, tl.where(rot, co, 1.0), tl.where(rot, si, 0.0)


@triton.jit
def _pair_vectors(q_row, stride_qr, k_row, stride_kr, qb_h, kb_h, sk_row, stride_skr, sa_row, ang_row, j0, dt, A,
                  N: tl.constexpr, R: tl.constexpr, HALF: tl.constexpr, ADJACENT: tl.constexpr):
    """What a tile of the pairs [j0, j0 + HALF) needs besides the state, rotated in registers (one angle per pair,
    no partner loads): θ' of the pairs, and per rank (tuples over r, each entry (lo, hi)) q̃_r, k̃_r and the
    previous step's k̃_r (the k state)."""
    theta, c, s = _pair_angles(sa_row, ang_row, j0, dt, A, HALF)
    q_rot = ()
    k_rot = ()
    k_old = ()
    for r in tl.static_range(R):
        k_rot = k_rot + (_rotated_pair(k_row + r * stride_kr, kb_h + r * N, j0, c, s, HALF, N, ADJACENT),)
        k_old = k_old + (_load_pairs(sk_row + r * stride_skr, j0, HALF, N, ADJACENT),)
        q_rot = q_rot + (_rotated_pair(q_row + r * stride_qr, qb_h + r * N, j0, c, s, HALF, N, ADJACENT),)
    return theta, q_rot, k_rot, k_old


def _lane_sum_ptx(nvalues):
    """PTX of the lanes' reduce-scatter: inputs $1..$nvalues are a lane's values x_j, output $0 is, in lane c of each
    16-lane half warp, Σ over the half's lanes of x_{c // (16 / nvalues)}. Level m (lane masks 8, 4, 2, 1) pairs x_j
    with x_{j + half}: a lane whose mask bit is set keeps the upper one and sends the lower one to its partner,
    which does the opposite, and adds what it receives. With fewer than 16 values the last levels add all."""
    lines = ["{", ".reg .pred p<4>;", ".reg .b32 lane, bit;", ".reg .f32 keep, send, got, v<16>;",
             "mov.u32 lane, %laneid;"]
    for b in range(4):
        lines += [f"and.b32 bit, lane, {1 << b};", f"setp.ne.u32 p{b}, bit, 0;"]
    vals = [f"${j + 1}" for j in range(nvalues)]
    for b in (3, 2, 1, 0):
        if len(vals) > 1:
            half = len(vals) // 2
            nxt = [f"v{j}" for j in range(half)]
            for j in range(half):
                lo, hi = vals[j], vals[j + half]
                lines += [f"selp.f32 keep, {hi}, {lo}, p{b};", f"selp.f32 send, {lo}, {hi}, p{b};",
                          f"shfl.sync.bfly.b32 got, send, {1 << b}, 0x1f, 0xffffffff;",
                          f"add.f32 {nxt[j]}, keep, got;"]
            vals = nxt
        else:
            lines += [f"shfl.sync.bfly.b32 got, {vals[0]}, {1 << b}, 0x1f, 0xffffffff;",
                      f"add.f32 v0, {vals[0]}, got;"]
            vals = ["v0"]
    lines += [f"mov.f32 $0, {vals[0]};", "}"]
    return "\n".join(lines)


_LANE_SUM_PTX_R2 = tl.constexpr(_lane_sum_ptx(8))
_LANE_SUM_PTX_R4 = tl.constexpr(_lane_sum_ptx(16))


@triton.jit
def _quads(x):
    """The 4 columns a lane holds of a (…, 64) half tile (columns 4c + j, j = 0..3) as four (…, 16) tensors."""
    a, b = tl.split(tl.reshape(x, x.shape[:-1] + (x.shape[-1] // 4, 2, 2)))
    x0, x2 = tl.split(a)
    x1, x3 = tl.split(b)
    return x0, x1, x2, x3


@triton.jit
def _lane_partials(lo, hi, q_lo, q_hi):
    """A lane's share of h'q̃_r over its 4 columns of the (8 × 64) half tiles (one FMA chain per row), split into
    its 4 row sets: four (2 × 16) tensors, row set s holding rows g + 2s of row group g (lane 16g + c holds rows
    of parity g)."""
    l0, l1, l2, l3 = _quads(lo)
    h0, h1, h2, h3 = _quads(hi)
    a0, a1, a2, a3 = _quads(q_lo)
    b0, b1, b2, b3 = _quads(q_hi)
    part = l0 * a0[None, :]
    part = tl.fma(h0, b0[None, :], part)
    part = tl.fma(l1, a1[None, :], part)
    part = tl.fma(h1, b1[None, :], part)
    part = tl.fma(l2, a2[None, :], part)
    part = tl.fma(h2, b2[None, :], part)
    part = tl.fma(l3, a3[None, :], part)
    part = tl.fma(h3, b3[None, :], part)                         # (8 rows, 16 column groups)
    part = tl.permute(tl.reshape(part, (4, 2, 16)), (1, 2, 0))   # (row group, column group, row set)
    a, b = tl.split(tl.reshape(part, (2, 16, 2, 2)))
    s0, s2 = tl.split(a)
    s1, s3 = tl.split(b)
    return s0, s1, s2, s3


@triton.jit
def _update_pair_tile(lo, hi, alpha, u_new, u_old, psi, q_rot, k_rot, k_old,
                      R: tl.constexpr, BLOCK_R: tl.constexpr, HAS_PSI: tl.constexpr, LANES: tl.constexpr):
    """One (lo, hi) state tile: h' = α h + Σ_r (γ v ψ_r) k̃_rᵀ + (β v_prev ψ_r) k̃_prev,rᵀ, one FMA per term, and
    the tile's part of y_r = h' q̃_r (ψ: _rank_scales of the tile's rows). Returns (lo', hi', y): y is
    (rows × BLOCK_R), or with LANES the lanes' form (2 × 16) of the module docstring."""
    lo = alpha * lo.to(tl.float32)
    hi = alpha * hi.to(tl.float32)
    for r in tl.static_range(R):
        if HAS_PSI:
            un = u_new * psi[r]
            uo = u_old * psi[r]
        else:
            un = u_new
            uo = u_old
        k_lo, k_hi = k_rot[r]
        ko_lo, ko_hi = k_old[r]
        lo = lo + un[:, None] * k_lo[None, :]
        lo = lo + uo[:, None] * ko_lo[None, :]
        hi = hi + un[:, None] * k_hi[None, :]
        hi = hi + uo[:, None] * ko_hi[None, :]
    if LANES:
        tl.static_assert((R == 2 or R == 4) and lo.shape[0] == 8 and lo.shape[1] == 64)
        parts = ()
        for r in tl.static_range(R):
            parts = parts + _lane_partials(lo, hi, q_rot[r][0], q_rot[r][1])
        if R == 4:
            y = tl.inline_asm_elementwise(_LANE_SUM_PTX_R4, "=f" + ",f" * 16, list(parts), dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:
            y = tl.inline_asm_elementwise(_LANE_SUM_PTX_R2, "=f" + ",f" * 8, list(parts), dtype=tl.float32,
                                          is_pure=True, pack=1)
    else:
        rr = tl.arange(0, BLOCK_R)
        y = tl.zeros((lo.shape[0], BLOCK_R), dtype=tl.float32)
        for r in tl.static_range(R):
            q_lo, q_hi = q_rot[r]
            yr = tl.sum(lo * q_lo[None, :] + hi * q_hi[None, :], axis=1)
            y += tl.where(rr[None, :] == r, yr[:, None], 0.0)
    return lo, hi, y


@triton.jit
def _finish_rows(y, v, zz, Dh, b, h, pp, pmask, P, H, norm_eps, mv_ptr, mz_ptr, mo_ptr, nw_ptr, out_ptr,
                 R: tl.constexpr, BLOCK_R: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
                 HAS_PSI: tl.constexpr, HAS_ZETA: tl.constexpr, HAS_PHI: tl.constexpr, PER_RANK: tl.constexpr,
                 RMS_NORM: tl.constexpr, HAS_NW: tl.constexpr):
    """The output stage of complete rows pp from y (rows × BLOCK_R): D, the RMSNorm over P (all of P in pp),
    the gate, the rank contraction or the per-rank output."""
    rr = tl.arange(0, BLOCK_R)
    rp = (h * R + rr[None, :]) * P + pp[:, None]    # (rows, R): a row reduction of a tile lands in it as is
    rpmask = pmask[:, None] & (rr < R)[None, :]
    if HAS_D:
        if HAS_PSI:
            y += Dh * v[:, None] * tl.load(mv_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
        else:
            y += Dh * v[:, None]
    y = tl.where(rpmask, y, 0.0)
    if RMS_NORM:
        ms = tl.sum(y * y, axis=0) / P
        y = y * tl.rsqrt(ms + norm_eps)[None, :]
        if HAS_NW:
            y = y * tl.load(nw_ptr + h * P + pp, mask=pmask, other=0.0).to(tl.float32)[:, None]
    if HAS_Z:
        if HAS_ZETA:
            gate = zz[:, None] * tl.load(mz_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
        else:
            gate = zz[:, None] + tl.zeros_like(y)
        y = y * gate * tl.sigmoid(gate)
    if PER_RANK:
        tl.store(out_ptr + ((b * R + rr[None, :]) * H + h) * P + pp[:, None], y.to(out_ptr.dtype.element_ty),
                 mask=rpmask)
    else:
        if HAS_PHI:
            y = y * tl.load(mo_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + (b * H + h) * P + pp, tl.sum(y, axis=1).to(out_ptr.dtype.element_ty), mask=pmask)


@triton.jit
def _lane_rows(p0, R: tl.constexpr):
    """The lanes' form of the 8 rows from p0: y[g, c] is value j = c // DUP (DUP = 16 / 4R copies per value) =
    rank j // 4 of row p0 + g + 2 (j % 4). Returns (j (16,), the rows (2 × 16))."""
    DUP: tl.constexpr = 16 // (4 * R)
    j = tl.arange(0, 16) // DUP
    return j, p0 + tl.arange(0, 2)[:, None] + 2 * (j % 4)[None, :]


@triton.jit
def _lane_inputs(p0, v_row, z_row, Dh, h, P, mv_ptr, mz_ptr, mo_ptr, R: tl.constexpr, HAS_D: tl.constexpr,
                 HAS_Z: tl.constexpr, HAS_PSI: tl.constexpr, HAS_ZETA: tl.constexpr, HAS_PHI: tl.constexpr):
    """What _finish_rows_lanes needs besides y for the 8 rows from p0, in y's lanes' form (_lane_rows): the skip
    term's scale D·v·ψ, the gate z·ζ and the output weight φ (1.0 where absent; with HAS_Z false the gate is
    unused). v and z are loaded again in this layout (the tile's first loads were in another one): issued before
    the tile's update, so that they arrive while it runs."""
    j, pp = _lane_rows(p0, R)
    pmask = pp < P
    rp = (h * R + (j // 4)[None, :]) * P + pp
    skip = 0.0
    if HAS_D:
        skip = Dh * tl.load(v_row + pp, mask=pmask, other=0.0).to(tl.float32)
        if HAS_PSI:
            skip = skip * tl.load(mv_ptr + rp, mask=pmask, other=0.0).to(tl.float32)
    gate = 1.0
    if HAS_Z:
        gate = tl.load(z_row + pp, mask=pmask, other=0.0).to(tl.float32)
        if HAS_ZETA:
            gate = gate * tl.load(mz_ptr + rp, mask=pmask, other=0.0).to(tl.float32)
    phi = 1.0
    if HAS_PHI:
        phi = tl.load(mo_ptr + rp, mask=pmask, other=0.0).to(tl.float32)
    return skip, gate, phi


@triton.jit
def _finish_rows_lanes(y, lane_in, p0, b, h, P, H, out_ptr, R: tl.constexpr, HAS_D: tl.constexpr,
                       HAS_Z: tl.constexpr, HAS_PHI: tl.constexpr, PER_RANK: tl.constexpr):
    """_finish_rows (without RMSNorm) for the 8 rows from p0 with y and lane_in (_lane_inputs) in the lanes' form
    (_lane_rows)."""
    DUP: tl.constexpr = 16 // (4 * R)
    skip, gate, phi = lane_in
    g = tl.arange(0, 2)
    cc = tl.arange(0, 16)
    j, pp = _lane_rows(p0, R)
    if HAS_D:
        y += skip
    if HAS_Z:
        y = y * gate * tl.sigmoid(gate)
    if PER_RANK:
        tl.store(out_ptr + ((b * R + (j // 4)[None, :]) * H + h) * P + pp, y.to(out_ptr.dtype.element_ty),
                 mask=(pp < P) & (cc % DUP == 0)[None, :])
    else:
        if HAS_PHI:
            y = y * phi
        total = tl.sum(tl.reshape(y, (2, R, 16 // R)), axis=1)            # over the ranks: (row group, k)
        k = tl.arange(0, 16 // R)
        pt = p0 + g[:, None] + 2 * (k // DUP)[None, :]
        tl.store(out_ptr + (b * H + h) * P + pt, total.to(out_ptr.dtype.element_ty),
                 mask=(pt < P) & (k % DUP == 0)[None, :])


@triton.jit
def _zero_rows(out_ptr, b, h, pp, pmask, H, P, R: tl.constexpr, BLOCK_R: tl.constexpr, PER_RANK: tl.constexpr):
    """The output of rows pp of a padded slot (negative state index): zeros."""
    if PER_RANK:
        rr = tl.arange(0, BLOCK_R)
        tl.store(out_ptr + ((b * R + rr[None, :]) * H + h) * P + pp[:, None],
                 tl.zeros((pp.shape[0], BLOCK_R), dtype=out_ptr.dtype.element_ty),
                 mask=pmask[:, None] & (rr < R)[None, :])
    else:
        tl.store(out_ptr + (b * H + h) * P + pp, tl.zeros(pp.shape, dtype=out_ptr.dtype.element_ty), mask=pmask)


@triton.jit
def _store_small_states(theta, k_rot, v_row, sa_row, sk_row, stride_skr, sv_row, P, A, N: tl.constexpr,
                        R: tl.constexpr, HALF: tl.constexpr, BLOCK_P: tl.constexpr, ROW_TILES: tl.constexpr,
                        ADJACENT: tl.constexpr):
    """θ' (the pairs [0, HALF) ⊇ [0, A)), k̃ (R × N, tuples over r of (lo, hi)) and v (ROW_TILES × BLOCK_P ≥ P) of one
    (row, head) into its angle, k and v state rows, by the only program that read the old ones. A row is
    replicated over threads, so a barrier keeps every thread's reads of the old values before any thread's
    stores (Triton orders a store after a load of the same address only within one thread)."""
    tl.debug_barrier()
    jj = tl.arange(0, HALF)
    tl.store(sa_row + jj, theta.to(sa_row.dtype.element_ty), mask=jj < A)
    for r in tl.static_range(R):
        k_lo, k_hi = k_rot[r]
        _store_pairs(sk_row + r * stride_skr, 0, k_lo, k_hi, HALF, N, ADJACENT)
    for t in range(ROW_TILES):
        pp = t * BLOCK_P + tl.arange(0, BLOCK_P)
        tl.store(sv_row + pp, tl.load(v_row + pp, mask=pp < P).to(sv_row.dtype.element_ty), mask=pp < P)


@triton.jit
def _state_row(sbi_ptr, b, HAS_SBI: tl.constexpr):
    """The state row of batch row b (negative: a padded slot)."""
    if HAS_SBI:
        return tl.load(sbi_ptr + b).to(tl.int64)
    else:
        return b.to(tl.int64)


@triton.jit
def _head_scalars(adt_ptr, dt_ptr, trap_ptr, b, h, H):
    """(dt, α = e^a, γ = λ·dt, β = (1 − λ)·dt·α) of one (row, head), fp32."""
    a = tl.load(adt_ptr + b * H + h).to(tl.float32)
    dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
    lam = tl.sigmoid(tl.load(trap_ptr + b * H + h).to(tl.float32))
    alpha = tl.exp(a)
    return dt, alpha, lam * dt, (1.0 - lam) * dt * alpha


@triton.jit
def _row_inputs(v_row, sv_row, z_row, pp, pmask, HAS_Z: tl.constexpr):
    """v, the previous v (the v state) and z of the rows pp, fp32 (z: zeros without a gate)."""
    v = tl.load(v_row + pp, mask=pmask, other=0.0).to(tl.float32)
    vprev = tl.load(sv_row + pp, mask=pmask, other=0.0).to(tl.float32)
    if HAS_Z:
        zz = tl.load(z_row + pp, mask=pmask, other=0.0).to(tl.float32)
    else:
        zz = tl.zeros_like(v)
    return v, vprev, zz


@triton.jit
def mamba3_step_kernel(
    q_ptr, k_ptr, v_ptr, z_ptr, adt_ptr, dt_ptr, trap_ptr, ang_ptr,
    qb_ptr, kb_ptr, D_ptr, mv_ptr, mz_ptr, mo_ptr, nw_ptr,
    sa_ptr, ss_ptr, sk_ptr, sv_ptr, sbi_ptr, out_ptr,
    stride_qb, stride_qr, stride_qg, stride_kb, stride_kr, stride_kg,
    stride_vb, stride_vh, stride_zb, stride_zh, stride_angb, stride_angh,
    stride_sab, stride_sah, stride_ssb, stride_ssh, stride_ssp: tl.constexpr,
    stride_skb, stride_skr, stride_skh, stride_svb, stride_svh,
    H, heads_per_group, P, A, norm_eps,
    N: tl.constexpr,
    R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    ROW_TILES: tl.constexpr, WRITE_SMALL: tl.constexpr,
    ADJACENT: tl.constexpr, HAS_SBI: tl.constexpr, HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_PSI: tl.constexpr, HAS_ZETA: tl.constexpr, HAS_PHI: tl.constexpr,
    PER_RANK: tl.constexpr, RMS_NORM: tl.constexpr, HAS_NW: tl.constexpr, LANE_SUMS: tl.constexpr,
):
    """The state update and output of ROW_TILES × BLOCK_P rows of one (batch row, head); see the module docstring.

    Whole rows (BLOCK_N ≥ N): θ', q̃, k̃ and the previous k̃ computed once, then ROW_TILES tiles streamed with the
    next one prefetched; WRITE_SMALL (all of P here): θ', k̃ and v written at the end. N in several tiles
    (BLOCK_N < N; ROW_TILES = 1): the pair blocks of the one row tile streamed, q̃/k̃ computed per block."""
    HALF: tl.constexpr = BLOCK_N // 2   # pairs per tile
    LANES: tl.constexpr = LANE_SUMS and COMPILED   # inline PTX: not in the interpreter
    b = tl.program_id(2)
    h = tl.program_id(1)
    srow = _state_row(sbi_ptr, b, HAS_SBI)
    b = b.to(tl.int64)
    p0 = tl.program_id(0) * (BLOCK_P * ROW_TILES)
    if srow >= 0:
        g = h // heads_per_group
        ss_row = ss_ptr + srow * stride_ssb + h * stride_ssh
        sa_row = sa_ptr + srow * stride_sab + h * stride_sah
        sk_row = sk_ptr + srow * stride_skb + h * stride_skh
        sv_row = sv_ptr + srow * stride_svb + h * stride_svh
        v_row = v_ptr + b * stride_vb + h * stride_vh
        q_row = q_ptr + b * stride_qb + g * stride_qg
        k_row = k_ptr + b * stride_kb + g * stride_kg
        ang_row = ang_ptr + b * stride_angb + h * stride_angh
        z_row = z_ptr + b * stride_zb + h * stride_zh
        # The first state tile is requested before anything else (warps issue in order: an early use of a
        # loaded value would hold back every load behind it).
        pp = p0 + tl.arange(0, BLOCK_P)
        lo, hi = _load_pair_tile(ss_row, pp, pp < P, 0, HALF, N, stride_ssp, ADJACENT)
        dt, alpha, gamma, beta = _head_scalars(adt_ptr, dt_ptr, trap_ptr, b, h, H)
        if HAS_D:
            Dh = tl.load(D_ptr + h).to(tl.float32)
        else:
            Dh = 0.0
        if BLOCK_N >= N:
            theta, q_rot, k_rot, k_old = _pair_vectors(q_row, stride_qr, k_row, stride_kr, qb_ptr + h * R * N,
                                                       kb_ptr + h * R * N, sk_row, stride_skr, sa_row, ang_row, 0,
                                                       dt, A, N, R, HALF, ADJACENT)
            # Each tile's row inputs (v, v_prev, z, ψ_r) are requested one tile ahead, beside the next state tile,
            # and the output stage's (_lane_inputs) at the top of their tile: requested where they are used, after
            # the previous stores (the compiler cannot hoist a load above a store that might alias it), they were
            # waited for at once with too few other warps to hide it (8 of these ≈ 250-register programs per SM;
            # H200, batch 128, R = 4: 0.1653 → 0.1583 ms, benchmarks/results/step_pipelined_h200.md)
            pmask = pp < P
            v, vprev, zz = _row_inputs(v_row, sv_row, z_row, pp, pmask, HAS_Z)
            psi = _rank_scales(mv_ptr + h * R * P, pp, pmask, P, R, HAS_PSI)
            for t in range(ROW_TILES):
                pp = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
                pmask = pp < P
                if ROW_TILES > 1:  # the next tile (nothing after the last one)
                    next_rows = pp + BLOCK_P
                    next_mask = (next_rows < P) & (t + 1 < ROW_TILES)
                    next_lo, next_hi = _load_pair_tile(ss_row, next_rows, next_mask, 0, HALF, N, stride_ssp,
                                                       ADJACENT)
                    next_v, next_vprev, next_zz = _row_inputs(v_row, sv_row, z_row, next_rows, next_mask, HAS_Z)
                    next_psi = _rank_scales(mv_ptr + h * R * P, next_rows, next_mask, P, R, HAS_PSI)
                if LANES:
                    lane_in = _lane_inputs(p0 + t * BLOCK_P, v_row, z_row, Dh, h, P, mv_ptr, mz_ptr, mo_ptr, R,
                                           HAS_D, HAS_Z, HAS_PSI, HAS_ZETA, HAS_PHI)
                lo, hi, y = _update_pair_tile(lo, hi, alpha, gamma * v, beta * vprev, psi, q_rot, k_rot, k_old,
                                              R, BLOCK_R, HAS_PSI, LANES)
                _store_pair_tile(ss_row, pp, pmask, 0, lo, hi, HALF, N, stride_ssp, ADJACENT)
                if LANES:
                    _finish_rows_lanes(y, lane_in, p0 + t * BLOCK_P, b, h, P, H, out_ptr, R, HAS_D, HAS_Z, HAS_PHI,
                                       PER_RANK)
                else:
                    _finish_rows(y, v, zz, Dh, b, h, pp, pmask, P, H, norm_eps, mv_ptr, mz_ptr, mo_ptr, nw_ptr,
                                 out_ptr, R, BLOCK_R, HAS_D, HAS_Z, HAS_PSI, HAS_ZETA, HAS_PHI, PER_RANK, RMS_NORM,
                                 HAS_NW)
                if ROW_TILES > 1:
                    lo, hi = next_lo, next_hi
                    v, vprev, zz, psi = next_v, next_vprev, next_zz, next_psi
            if WRITE_SMALL:  # every old θ, k̃ and v of this (row, head) has been read, by this program alone
                _store_small_states(theta, k_rot, v_row, sa_row, sk_row, stride_skr, sv_row, P, A, N, R, HALF,
                                    BLOCK_P, ROW_TILES, ADJACENT)
        else:
            pmask = pp < P
            v, vprev, zz = _row_inputs(v_row, sv_row, z_row, pp, pmask, HAS_Z)
            psi = _rank_scales(mv_ptr + h * R * P, pp, pmask, P, R, HAS_PSI)
            if LANES:
                lane_in = _lane_inputs(p0, v_row, z_row, Dh, h, P, mv_ptr, mz_ptr, mo_ptr, R, HAS_D, HAS_Z, HAS_PSI,
                                       HAS_ZETA, HAS_PHI)
                y = tl.zeros((2, 16), dtype=tl.float32)
            else:
                y = tl.zeros((BLOCK_P, BLOCK_R), dtype=tl.float32)
            for j0 in range(0, N // 2, HALF):
                next_lo, next_hi = _load_pair_tile(ss_row, pp, pmask, j0 + HALF, HALF, N, stride_ssp, ADJACENT)
                _theta, q_rot, k_rot, k_old = _pair_vectors(q_row, stride_qr, k_row, stride_kr, qb_ptr + h * R * N,
                                                            kb_ptr + h * R * N, sk_row, stride_skr, sa_row, ang_row,
                                                            j0, dt, A, N, R, HALF, ADJACENT)
                lo, hi, y_part = _update_pair_tile(lo, hi, alpha, gamma * v, beta * vprev, psi, q_rot, k_rot, k_old,
                                                   R, BLOCK_R, HAS_PSI, LANES)
                y += y_part
                _store_pair_tile(ss_row, pp, pmask, j0, lo, hi, HALF, N, stride_ssp, ADJACENT)
                lo, hi = next_lo, next_hi
            if LANES:
                _finish_rows_lanes(y, lane_in, p0, b, h, P, H, out_ptr, R, HAS_D, HAS_Z, HAS_PHI, PER_RANK)
            else:
                _finish_rows(y, v, zz, Dh, b, h, pp, pmask, P, H, norm_eps, mv_ptr, mz_ptr, mo_ptr, nw_ptr,
                             out_ptr, R, BLOCK_R, HAS_D, HAS_Z, HAS_PSI, HAS_ZETA, HAS_PHI, PER_RANK, RMS_NORM,
                             HAS_NW)
    else:
        for t in range(ROW_TILES):
            pp = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
            _zero_rows(out_ptr, b, h, pp, pp < P, H, P, R, BLOCK_R, PER_RANK)


@triton.jit
def mamba3_step_rows_kernel(
    k_ptr, v_ptr, dt_ptr, ang_ptr, kb_ptr, sa_ptr, sk_ptr, sv_ptr, sbi_ptr,
    stride_kb, stride_kr, stride_kg, stride_vb, stride_vh, stride_angb, stride_angh,
    stride_sab, stride_sah, stride_skb, stride_skr, stride_skh, stride_svb, stride_svh,
    H, heads_per_group, P, A,
    N: tl.constexpr, R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    ADJACENT: tl.constexpr, HAS_SBI: tl.constexpr,
):
    """The new small states of one (row, head): θ', k̃ (R × N) and v (BLOCK_P ≥ P), after the state kernel (when
    several programs share a row and head)."""
    HALF: tl.constexpr = BLOCK_N // 2   # every pair
    b = tl.program_id(1)
    h = tl.program_id(0)
    srow = _state_row(sbi_ptr, b, HAS_SBI)
    b = b.to(tl.int64)
    if srow >= 0:
        g = h // heads_per_group
        dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
        sa_row = sa_ptr + srow * stride_sab + h * stride_sah
        theta, c, s = _pair_angles(sa_row, ang_ptr + b * stride_angb + h * stride_angh, 0, dt, A, HALF)
        k_row = k_ptr + b * stride_kb + g * stride_kg
        k_rot = ()
        for r in tl.static_range(R):
            k_rot = k_rot + (_rotated_pair(k_row + r * stride_kr, kb_ptr + (h * R + r) * N, 0, c, s, HALF, N,
                                           ADJACENT),)
        _store_small_states(theta, k_rot, v_ptr + b * stride_vb + h * stride_vh, sa_row,
                            sk_ptr + srow * stride_skb + h * stride_skh, stride_skr,
                            sv_ptr + srow * stride_svb + h * stride_svh, P, A, N, R, HALF, BLOCK_P, 1, ADJACENT)
