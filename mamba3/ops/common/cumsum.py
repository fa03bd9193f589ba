"""Decay and angle cumsums across chunks (shared by SISO and MIMO).

Contract
--------
``chunk_sums(adt, dt, trap, angles, chunks, nangles)`` → ``(gsum (nchunks, H) fp32, asum (nchunks, H, A) fp32,
    coef (3, B, H, T) fp32)``: gsum[c, h] = Σ_{t∈c} adt[b, h, t] (the chunk's total log-decay), asum[c, h, a] =
    Σ_{t∈c} π·tanh(φ_{t,a})·dt_t (per head, also when the angles are shared across heads), and per token the
    planes cs (within-chunk cumsum of adt), γ and scale of ``tiles.chunk_scalars``, which the SISO chunk kernels
    load (``tiles.chunk_coefficients``). One program per (chunk, head).
``angle_offsets(asum, chunks, angle_state)`` → ``(offset (nchunks, H, A) fp32, final_angle (NS, H, A) float64)``:
    θ at the start of chunk c is offset[c] + (within-chunk cumsum), offset[c] = (θ_init + Σ_{c'<c} asum[c']) mod 2π.
    The prefix runs in float64 over chunk sums wrapped mod 2π, so the angles' precision does not depend on T.
``rotation_planes(angles, dt, offset, chunks, nheads, nangles)`` → ``(rot (2, B, T, H, A) fp32, plane)``: sin θ and
    cos θ of every (token, head, angle), θ = offset[c] + within-chunk cumsum (as in the chunk kernels), computed once
    per call so that the chunk kernels load them instead of recomputing θ and its sin/cos in every kernel and N
    block; ``plane`` = B·T·H·A is the offset of the cos plane. One program per (chunk, block of 128 (head, angle)
    columns), a thread per column (``rotation_kernel``).
``angle_cumsum(angles, dt, chunks, nheads, nangles, angle_state)`` → ``(theta (B, T, H, A) fp32 in [0, 2π),
    final_angle)``: the same θ itself, wrapped (MIMO's angles): the angle sums alone (``chunk_sums_kernel`` without
    the coefficient table), ``angle_offsets`` and ``rotation_kernel`` in θ mode.
``angle_backward(R, dfinal_angle, angles, dt, chunks, ...)`` → ``(dangles fp32, ddt_angle (B, H, T) fp32,
    dangle_state (NS, H, A))``, where ``R`` (B, T, H, A) fp32 holds, per token, the gradient w.r.t. θ_t (what the
    per-chunk backward kernels produce). θ_t is a cumsum of the increments, so each increment's gradient is the
    reverse cumsum G_t = Σ_{s≥t} R_s + dθ_final over its sequence: within the chunk in ``angle_bwd_kernel``, the
    later chunks' totals (``angle_totals_kernel``, then a float64 prefix) added to it. dφ = π·sech²(φ)·dt·G
    (summed over heads when the angles are shared), ddt += Σ_a π·tanh(φ)·G. The mod 2π is treated as the identity
    for gradients.

Layouts: adt, dt (B, H, T) with unit time stride; angles (B, T, H, A) or shared (B, T, A) with unit last stride.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunking import Chunks
from .launch import launch
from .tiles import (PI, batch_strides, chunk_row, chunk_scalars, head_angle_rows, sincos,
                    tanh_sech2, wrap_angle)


@triton.jit(do_not_specialize=["T", "coef_plane"])
def chunk_sums_kernel(adt_ptr, dt_ptr, trap_ptr, ang_ptr, gsum_ptr, asum_ptr, coef_ptr, coef_plane, table_ptr,
                      T, sa_t, sa_h, H, A,
                      C: tl.constexpr, BA: tl.constexpr, HAS_ANG: tl.constexpr, HAS_COEF: tl.constexpr):
    """Per (chunk, head): the angle sums (HAS_ANG) and, with HAS_COEF, Σ adt and the coefficient table (see the
    module docstring). Without HAS_COEF adt, trap, gsum and coef are not touched (MIMO's angles)."""
    _, _, s_h, s_b, sa_b = batch_strides(T, H, 0, 0, sa_t)
    pid = tl.program_id(0).to(tl.int64)  # chunk-major, head fastest (DRAM locality of (B, T, H, A) angles)
    c = pid // H
    h = pid % H
    bidx, t0, L, t_end = chunk_row(table_ptr, c)
    if HAS_COEF:
        i, m, a, dt, _, gamma, scale, cs = chunk_scalars(adt_ptr, dt_ptr, trap_ptr, bidx * s_b + h * s_h, t0, L,
                                                         t_end, C)
        tl.store(gsum_ptr + c * H + h, tl.sum(a, 0))
        row = coef_ptr + bidx * s_b + h * s_h + t0 + i
        tl.store(row, cs, mask=m)
        tl.store(row + coef_plane, gamma, mask=m)
        tl.store(row + 2 * coef_plane, scale, mask=m)
    else:
        i = tl.arange(0, C)
        m = i < L
        dt = tl.load(dt_ptr + bidx * s_b + h * s_h + t0 + i, mask=m, other=0.0).to(tl.float32)
    if HAS_ANG:
        pa = tl.arange(0, BA)
        am = pa < A
        row = bidx * sa_b + (t0 + i) * sa_t + h * sa_h
        phi = tl.load(ang_ptr + row[:, None] + pa[None, :], mask=m[:, None] & am[None, :], other=0.0).to(tl.float32)
        th, _ = tanh_sech2(phi)
        inc = 3.141592653589793 * th * dt[:, None]
        tl.store(asum_ptr + (c * H + h) * A + pa, tl.sum(inc, 0), mask=am)


def _angle_strides(angles, nheads: int, nangles: int):
    """(shared, token stride, head stride) of contiguous angle rates: (B, T, A) shared by the heads (head stride
    0) or (B, T, H, A)."""
    shared = angles.dim() == 3
    return shared, nangles if shared else nheads * nangles, 0 if shared else nangles


def _sums_warps(ba: int) -> int:
    """Warps of chunk_sums_kernel: one for up to 32 angles (a C×32 tile), more for wider angle blocks (C×128 at one
    warp spilled 568 B, AOT sm_90)."""
    return min(4, max(1, ba // 32))


def _angle_totals_warps(ba: int) -> int:
    """Warps of angle_totals_kernel (a C × BA tile): two for up to 32 angles, more for wider blocks (C × 128 tiles
    at two warps spilled 9.5 KB in the former angle_bwd_kernel of the same shape, AOT sm_90)."""
    return min(8, max(2, ba // 16))


def chunk_sums(adt, dt, trap, angles, chunks: Chunks, nheads: int, nangles: int):
    """Launch :func:`chunk_sums_kernel`. adt/dt/trap must have unit time stride, angles unit last stride."""
    dev = adt.device
    gsum = torch.empty(chunks.nchunks, nheads, device=dev, dtype=torch.float32)
    asum = torch.empty(chunks.nchunks, nheads, max(nangles, 1), device=dev, dtype=torch.float32)
    coef = torch.empty((3,) + tuple(adt.shape), device=dev, dtype=torch.float32)  # every token is written
    assert angles.is_contiguous() and adt.is_contiguous() and dt.is_contiguous() and trap.is_contiguous()
    _sums_launch(adt, dt, trap, angles, gsum, asum, coef, chunks, nheads, nangles, has_coef=True)
    return gsum, asum[..., :nangles], coef


def _sums_launch(adt, dt, trap, angles, gsum, asum, coef, chunks: Chunks, nheads: int, nangles: int, has_coef: bool):
    """Launch :func:`chunk_sums_kernel` (without ``has_coef``: adt, trap, gsum and coef are not touched)."""
    _, sa_t, sa_h = _angle_strides(angles, nheads, nangles)
    ba = triton.next_power_of_2(max(nangles, 1))
    launch(chunk_sums_kernel, (chunks.nchunks * nheads,),
           adt, dt, trap, angles, gsum, asum, coef, coef.numel() // 3 if has_coef else 0, chunks.chunk_table,
           dt.shape[-1], sa_t, sa_h, nheads, nangles, C=chunks.chunk_size, BA=ba, HAS_ANG=nangles > 0,
           HAS_COEF=has_coef, num_warps=_sums_warps(ba))


def angle_cumsum(angles, dt, chunks: Chunks, nheads: int, nangles: int, angle_state=None):
    """θ (B, T, H, A) fp32 in [0, 2π) of every token, head and angle (the MIMO kernels' angles), and the final angle
    state (NS, H, A) float64: the angle sums of ``chunk_sums_kernel``, their float64 prefix (``angle_offsets``) and
    ``rotation_kernel``'s within-chunk running sums. Every step is chunk-parallel, so one long sequence is as fast
    as a batch of short ones. Not differentiable by itself: ``angle_backward`` is its backward (the mod 2π is the
    identity for gradients)."""
    assert angles.is_contiguous() and dt.is_contiguous()
    B, T = dt.shape[0], dt.shape[-1]
    dev = dt.device
    asum = torch.empty(chunks.nchunks, nheads, nangles, device=dev, dtype=torch.float32)
    _sums_launch(dt, dt, dt, angles, asum, asum, asum, chunks, nheads, nangles, has_coef=False)
    off, final = angle_offsets(asum, chunks, angle_state)
    theta = torch.empty(B, T, nheads, nangles, device=dev, dtype=torch.float32)
    _rotation_launch(angles, dt, off, chunks, nheads, nangles, theta, 0, theta=True)
    return theta, final


@triton.jit(do_not_specialize=["T", "plane"])
def rotation_kernel(ang_ptr, dt_ptr, off_ptr, out_ptr, table_ptr, T, sa_t, sa_h, H, A, plane,
                    C: tl.constexpr, BLOCK: tl.constexpr, TOKENS: tl.constexpr, THETA: tl.constexpr):
    """One chunk's θ_t = offset + Σ_{s ≤ t, s in the chunk} π·tanh(φ_s)·dt_s for BLOCK (head, angle) columns
    (grid: chunk, column block). THETA: θ mod 2π itself (out_ptr: (B, T, H, A)); else sin θ at out_ptr and cos θ
    at out_ptr + plane ((2, B, T, H, A) planes).

    Each thread owns one column and walks the chunk's tokens in order, so the within-chunk cumsum is a running
    sum in registers (no scan across threads) and every load of φ and store of θ (or sin, cos) is a row of
    consecutive columns. The tokens go in blocks of TOKENS: a block's φ and dt are all loaded before its first
    store (a store could alias a later load, so no load is issued past one), so that many loads per thread are in
    flight together. (The former C×32 tile per (chunk, head) at one warp with a cross-thread scan: 255 registers
    and 7344 instructions for 64 values per thread, AOT sm_90; 0.22-0.24 ms per launch on the H200 at B=8,
    T=4096, H=32, A=32, where the traffic takes ≈ 0.08.)"""
    _, _, s_h, s_b, sa_b = batch_strides(T, H, 0, 0, sa_t)
    c = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cm = col < H * A
    h = col // A
    a = col - h * A
    bidx, t0, L, _ = chunk_row(table_ptr, c)
    ang = ang_ptr + bidx * sa_b + t0 * sa_t + h * sa_h + a
    dtp = dt_ptr + bidx * s_b + h * s_h + t0
    rows = tl.where(cm, L, 0)  # tokens of this column: the mask of token i is one compare, i < rows
    off = tl.load(off_ptr + c * H * A + col, mask=cm, other=0.0)
    out = out_ptr + (bidx * T + t0) * (H * A) + col
    cs = tl.zeros([BLOCK], dtype=tl.float32)
    for i0 in range(0, C, TOKENS):
        phis = ()
        dts = ()
        for j in tl.static_range(TOKENS):
            phis = phis + (tl.load(ang + (i0 + j) * sa_t, mask=i0 + j < rows, other=0.0),)
            dts = dts + (tl.load(dtp + i0 + j, mask=i0 + j < rows, other=0.0),)
        for j in tl.static_range(TOKENS):
            m = i0 + j < rows
            th, _sech2 = tanh_sech2(phis[j].to(tl.float32))
            cs += PI * th * dts[j].to(tl.float32)
            if THETA:
                tl.store(out + (i0 + j) * (H * A), wrap_angle(cs + off), mask=m)
            else:
                si, co = sincos(cs + off)
                tl.store(out + (i0 + j) * (H * A), si, mask=m)
                tl.store(out + (i0 + j) * (H * A) + plane, co, mask=m)


# Tokens per block of rotation_kernel. Triton's compile time grows faster than the unrolled block (AOT sm_90, one
# kernel, on the CPU: 8 tokens 1.5 s, 16: 2.5 s, 32: 10 s, a whole 64-token chunk 65 s; with the whole chunk the
# H200's MIMO cold compile took 40.5 s instead of 14.9); 8 tokens: 40 registers, 648 instructions.
_ROTATION_TOKENS = 8


def _rotation_launch(angles, dt, offset, chunks: Chunks, nheads: int, nangles: int, out, plane: int, theta: bool):
    _, sa_t, sa_h = _angle_strides(angles, nheads, nangles)
    # one column per thread, 4 warps: 128 (head, angle) columns of one chunk per program
    block = 128
    launch(rotation_kernel, (chunks.nchunks, triton.cdiv(nheads * nangles, block)),
           angles, dt, offset, out, chunks.chunk_table, dt.shape[-1], sa_t, sa_h, nheads, nangles, plane,
           C=chunks.chunk_size, BLOCK=block, TOKENS=_ROTATION_TOKENS, THETA=theta, num_warps=block // 32)


def rotation_planes(angles, dt, offset, chunks: Chunks, nheads: int, nangles: int):
    """Launch :func:`rotation_kernel` for the sin/cos planes (see the module docstring). dt: (B, H, T) unit time
    stride; angles contiguous."""
    B, T = dt.shape[0], dt.shape[-1]
    plane = B * T * nheads * nangles
    rot = torch.empty(2, B, T, nheads, max(nangles, 1), device=dt.device, dtype=torch.float32)
    if nangles == 0:  # no rotation: the kernels never read the planes
        return rot, plane
    _rotation_launch(angles, dt, offset, chunks, nheads, nangles, rot, plane, theta=False)
    return rot, plane


@triton.jit
def chunk_prefix_kernel(x_ptr, init_ptr, out_ptr, end_ptr, seq_ptr, HA, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                        HAS_INIT: tl.constexpr, WRAP: tl.constexpr, REVERSE: tl.constexpr):
    """The float64 exclusive prefix over one sequence's chunks of x (nchunks, HA) for BLOCK columns: out[c] (fp32)
    = init + Σ of the chunks before c (after c: REVERSE), end (float64) = init + Σ of all; with WRAP every term and
    result is taken mod 2π. One thread per column walks the chunks in order; CHUNKS chunks' values are loaded
    before the first of them is used, so that many loads are in flight per thread."""
    s = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cm = col < HA
    first = tl.load(seq_ptr + 2 * s).to(tl.int64)
    count = tl.load(seq_ptr + 2 * s + 1)
    if HAS_INIT:
        acc = tl.load(init_ptr + s * HA + col, mask=cm, other=0.0).to(tl.float64)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float64)
    for j0 in range(0, count, CHUNKS):
        xs = ()
        for j in tl.static_range(CHUNKS):
            c = first + (count - 1 - j0 - j if REVERSE else j0 + j)
            xs = xs + (tl.load(x_ptr + c * HA + col, mask=cm & (j0 + j < count), other=0.0).to(tl.float64),)
        for j in tl.static_range(CHUNKS):
            c = first + (count - 1 - j0 - j if REVERSE else j0 + j)
            m = cm & (j0 + j < count)
            if WRAP:
                tl.store(out_ptr + c * HA + col, wrap_angle(acc).to(tl.float32), mask=m)
                acc += wrap_angle(xs[j])
            else:
                tl.store(out_ptr + c * HA + col, acc.to(tl.float32), mask=m)
                acc += xs[j]
    tl.store(end_ptr + s * HA + col, wrap_angle(acc) if WRAP else acc, mask=cm)


# columns per program of chunk_prefix_kernel (one per thread at 4 warps) and chunks loaded per block
_PREFIX_BLOCK = 128
_PREFIX_CHUNKS = 8


def _chunk_prefix(x, chunks: Chunks, init, wrap: bool, reverse: bool):
    """(out (nchunks, H, A) fp32, end (NS, H, A) float64) of :func:`chunk_prefix_kernel` for x (nchunks, H, A)."""
    nchunks, nheads, nangles = x.shape
    out = torch.empty(nchunks, nheads, nangles, device=x.device, dtype=torch.float32)
    end = torch.empty(chunks.nseq, nheads, nangles, device=x.device, dtype=torch.float64)
    ha = nheads * nangles
    if ha:
        launch(chunk_prefix_kernel, (chunks.nseq, triton.cdiv(ha, _PREFIX_BLOCK)), x.contiguous(),
               init.contiguous() if init is not None else x, out, end, chunks.seq_table, ha, BLOCK=_PREFIX_BLOCK,
               CHUNKS=_PREFIX_CHUNKS, HAS_INIT=init is not None, WRAP=wrap, REVERSE=reverse,
               num_warps=_PREFIX_BLOCK // 32)
    return out, end


def angle_offsets(asum: torch.Tensor, chunks: Chunks, angle_state: torch.Tensor | None):
    """θ offset of every chunk (fp32, in [0, 2π)) and the final angle state (float64): a float64 prefix over the
    chunk sums wrapped mod 2π, from the angle state (one launch; it was ≈ 20 small torch ops of host time)."""
    return _chunk_prefix(asum, chunks, angle_state, wrap=True, reverse=False)


@triton.jit(do_not_specialize=["T"])
def angle_totals_kernel(r_ptr, tot_ptr, table_ptr, T, H, A, C: tl.constexpr, BA: tl.constexpr):
    """Σ over each chunk's tokens of R (B, T, H, A) → (nchunks, H, A); one program per (chunk, head)."""
    pid = tl.program_id(0).to(tl.int64)
    c = pid // H
    h = pid % H
    bidx, t0, L, _ = chunk_row(table_ptr, c)
    i = tl.arange(0, C)
    pa = tl.arange(0, BA)
    am = pa < A
    r = tl.load(r_ptr + head_angle_rows(bidx, t0 + i, h, T, H, A)[:, None] + pa[None, :],
                mask=(i < L)[:, None] & am[None, :], other=0.0)
    tl.store(tot_ptr + (c * H + h) * A + pa, tl.sum(r, 0), mask=am)


@triton.jit(do_not_specialize=["T"])
def angle_bwd_kernel(ang_ptr, dt_ptr, r_ptr, dlater_ptr, dang_ptr, ddt_ptr, table_ptr, T, sa_t, sa_h, sd_part, H, A,
                     C: tl.constexpr, BH: tl.constexpr, BA: tl.constexpr, TOKENS: tl.constexpr,
                     SHARED: tl.constexpr):
    """One chunk's angle gradients for a block of BH heads × BA angles (grid: chunk, head block): walking the
    chunk's tokens from the last, G_t = dlater + Σ_{s ≥ t} R_s as a running sum per (head, angle) in registers,
    then per token ddt_t,h = Σ_a π·tanh(φ)·G (a reduction over the block's angles) and dφ = π·sech²(φ)·dt·G, summed
    over the block's heads when the angles are shared (B, T, A): then dang_ptr is this head block's slab (slab
    stride sd_part; the host sums the slabs when there are several).

    Tokens go in blocks of TOKENS whose loads are all issued before the block's first store, as in
    rotation_kernel. (The former kernel held a C × BA tile per (chunk, head), scanned it across threads with
    tl.cumsum and, for shared angles, looped over every head in one program per chunk: 0.15 ms per call on the
    H200 at B=8, T=4096, H=32, A=32, where the traffic takes ≈ 0.04.)"""
    _, _, s_h, s_b, sa_b = batch_strides(T, H, 0, 0, sa_t)
    c = tl.program_id(0).to(tl.int64)
    hh = tl.program_id(1) * BH + tl.arange(0, BH)
    aa = tl.arange(0, BA)
    hm = hh < H
    am = aa < A
    mm = hm[:, None] & am[None, :]
    bidx, t0, L, _ = chunk_row(table_ptr, c)
    col = hh[:, None] * A + aa[None, :]                      # (head, angle) column of R and dlater
    r = r_ptr + (bidx * T + t0) * (H * A) + col
    dtp = dt_ptr + bidx * s_b + hh * s_h + t0
    ddt = ddt_ptr + bidx * s_b + hh * s_h + t0
    if SHARED:
        ang = ang_ptr + bidx * sa_b + t0 * sa_t + aa
        dang = dang_ptr + tl.program_id(1).to(tl.int64) * sd_part + bidx * sa_b + t0 * sa_t + aa
        amask = am
    else:
        ang = ang_ptr + bidx * sa_b + t0 * sa_t + hh[:, None] * sa_h + aa[None, :]
        dang = dang_ptr + bidx * sa_b + t0 * sa_t + hh[:, None] * sa_h + aa[None, :]
        amask = mm
    g = tl.load(dlater_ptr + c * (H * A) + col, mask=mm, other=0.0)
    for i0 in range(0, C, TOKENS):
        rs = ()
        dts = ()
        phis = ()
        for j in tl.static_range(TOKENS):
            i = C - 1 - i0 - j                                   # tokens from the chunk's last
            rs = rs + (tl.load(r + i * (H * A), mask=mm & (i < L), other=0.0),)
            dts = dts + (tl.load(dtp + i, mask=hm & (i < L), other=0.0).to(tl.float32),)
            phis = phis + (tl.load(ang + i * sa_t, mask=amask & (i < L), other=0.0).to(tl.float32),)
        for j in tl.static_range(TOKENS):
            i = C - 1 - i0 - j
            g += rs[j]
            th, se = tanh_sech2(phis[j])
            if SHARED:
                tl.store(ddt + i, PI * tl.sum(th[None, :] * g, 1), mask=hm & (i < L))
                tl.store(dang + i * sa_t, PI * se * tl.sum(dts[j][:, None] * g, 0), mask=am & (i < L))
            else:
                tl.store(ddt + i, PI * tl.sum(th * g, 1), mask=hm & (i < L))
                tl.store(dang + i * sa_t, PI * se * dts[j][:, None] * g, mask=mm & (i < L))


# (head, angle) values per program of angle_bwd_kernel (4 per thread at 4 warps) and tokens per block. H200, B8
# T4096 H32 A32, shared angles: 512 (two head blocks, two slabs) with 8 tokens is what the GPU tests and the
# benchmark ran (`angle_bwd_kernel` 0.094 ms, the former kernel 0.155; the slabs' sum is a 2 MB reduction). The
# other variants were compared only through angle_backward's wall time, which its host-side torch calls bound
# (0.19-0.25 ms for every variant and the former kernel alike), so they are not ranked. AOT sm_90, no spills:
# 128 registers (A = 32, shared), 168 (A = 33: 64-wide angle blocks).
_ANGLE_BWD_ELEMS = 512
_ANGLE_BWD_TOKENS = 8


def angle_backward(R, dfinal_angle, angles, dt, chunks: Chunks, nheads: int, nangles: int):
    """See the module docstring. R: (B, T, H, A) fp32 contiguous. dfinal_angle: (NS, H, A) or None."""
    dev = R.device
    B, T = R.shape[0], R.shape[1]
    assert R.is_contiguous() and dt.is_contiguous()
    ba = triton.next_power_of_2(max(nangles, 1))
    doff = torch.empty(chunks.nchunks, nheads, nangles, device=dev, dtype=torch.float32)  # dθ summed per chunk
    launch(angle_totals_kernel, (chunks.nchunks * nheads,), R, doff, chunks.chunk_table, T, nheads, nangles,
           C=chunks.chunk_size, BA=ba, num_warps=_angle_totals_warps(ba))
    # dθ of every later chunk of the sequence and of the final angle (float64 sums), and the sequence's total
    dlater, seq_sum = _chunk_prefix(doff, chunks, dfinal_angle, wrap=False, reverse=True)
    shared, sa_t, sa_h = _angle_strides(angles, nheads, nangles)
    bh = min(triton.next_power_of_2(nheads), max(1, _ANGLE_BWD_ELEMS // ba))
    nhb = triton.cdiv(nheads, bh)
    # shared angles with several head blocks: one fp32 slab per block, summed below (no atomics: deterministic)
    slabs = nhb if shared and nhb > 1 else 0
    dang = torch.empty(((slabs,) if slabs else ()) + tuple(angles.shape), device=dev, dtype=torch.float32)
    ddt = torch.empty(B, nheads, T, device=dev, dtype=torch.float32)  # both fully written by the kernel
    ang = angles.contiguous()  # the kernel assumes dang's (contiguous) strides
    launch(angle_bwd_kernel, (chunks.nchunks, nhb), ang, dt, R, dlater, dang, ddt, chunks.chunk_table, T, sa_t,
           sa_h, dang.stride(0) if slabs else 0, nheads, nangles, C=chunks.chunk_size, BH=bh, BA=ba,
           TOKENS=_ANGLE_BWD_TOKENS, SHARED=shared, num_warps=max(1, min(8, bh * ba // 128)))
    return (dang.sum(0) if slabs else dang), ddt, seq_sum
