"""SISO forward: host launcher and the two per-chunk kernels.

Pipeline (all chunk-parallel except the light state pass; see ``mamba3/ops/common``):

1. ``chunk_sums``      (common) per (chunk, head): Σ adt and Σ π·tanh(φ)·dt, and the per-token table of cs (the
                       within-chunk cumsum of adt), γ and scale that every kernel below loads (no scan or sigmoid
                       per kernel).  Host: float64 prefix of the wrapped angle sums → θ offset per chunk (fp32 in
                       [0, 2π)), final angle state.
   ``rotation_planes`` (common) per (chunk, head): sin θ and cos θ of every token, head and angle (fp32), read by
                       every kernel below (and by the backward's) instead of recomputing θ, its within-chunk cumsum
                       and the sin/cos polynomials per kernel and N block (H200, bf16 B8 T4096: forward 2.19 →
                       1.75 ms, forward+backward 13.2 → 11.7 ms).
2. ``chunk_state_kernel`` (MODE=0) per (chunk, head, N-block, P-block): local state Σ_j e^{cs_L−cs_j}·scale_j·v_j k̃_jᵀ
                       written into the fp32 state buffer (nchunks, H, P, N).
3. ``state_passing``   (common) per (sequence, head, slab): the state entering each chunk, in place in the fp32
                       buffer, or on the 16-bit-dot path into a copy in the dot dtype (``SisoConfig.states16``); the
                       input state S_init = SSM_in + dt_0(1−λ_0)·V_in K_inᵀ enters, the final state leaves.
4. ``output_kernel``   per (chunk, head): y_i = e^{cs_i}·S q̃_i + Σ_{j<i} e^{cs_i−cs_j}·scale_j·(q̃_i·k̃_j)·v_j
                       + (D + γ_i·q̂_i·k̂_i)·v_i, out = y ⊙ silu(z).

The same ``chunk_state_kernel`` with MODE=1 computes the backward's local dS (Σ_i e^{cs_i}·dy_i q̃_iᵀ). Where
``function._scan_states`` says so (16-bit dots, equal-length sequences, ≥ 1.5 programs per SM; or
``SisoConfig.scan_states``), steps 2 and 3 — and the backward's local dS with its reverse pass —
are one kernel, ``chunk_state_scan_kernel``, that walks each sequence's chunks.

Rotation: a C×BN tile of q or k is loaded as even/odd C×BN/2 halves (``load_pairs``) and rotated in fp32. Two
operand layouts (``SisoConfig.halves``): re-interleaved (``join_pairs``) into one C×BN dot operand (the 16-bit
path), or the halves as separate dot operands (the fp32-operand path, so HALVES implies DOT_DT = fp32: Triton 3.6
rejects re-interleaved/transposed FMA-dot operands on Blackwell, and a dot over a block is the sum of the halves'
dots), loaded as contiguous tiles split in registers and stored re-interleaved (``SisoConfig.contiguous_halves``,
the default) or, with STRIDED, by stride-2 loads and stores (a quarter of each 32-byte sector per access).
Angles, cumsums, decays and states are fp32 throughout; for 16-bit inputs the dot operands are cast to the input
dtype (fp32 accumulation), fp32 operands run with the config's fp32-accurate ``input_precision`` (tf32x3 by
default) unless the caller opted into tf32.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.tiles import (add_bias_pairs, batch_strides, chunk_row, chunk_coefficients, coefficient_loads, fast_exp,
                            fast_sigmoid, head_angle_rows, join_pairs, load_pairs, rotation_tile, split_pairs,
                            walk_chunk)


@triton.jit
def local_chunk_state(x_ptr, z_ptr, k_ptr, kb_ptr, rot_ptr, rot_plane, bidx, t0, L, cs_last, cs_rows, scale, h, nb,
                      p, T, sx_t, sk_t, H, HPG, A,
                      N: tl.constexpr, P: tl.constexpr, C: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                      MODE: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HALVES: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, STRIDED: tl.constexpr):
    """Σ_j w_j·x_j k̃_jᵀ over the tokens j of chunk c for head h, state rows p and N block nb (fp32). MODE 0: x = v,
    k̃ = R(θ)(k + b_k), w = e^{cs_L − cs_j}·scale_j (the local state); MODE 1: x = dO ⊙ silu(z), k̃ = q̃, w = e^{cs_j}
    (the backward's local dS). The chunk is given by its table row (bidx, t0, L) and :func:`coefficient_loads`' cs_last,
    cs_rows and scale. Returns the (even, odd) column halves, [BP, BN/2] each, with HALVES, else the [BP, BN] block
    (twice)."""
    sx_b, sk_b, _, _, _ = batch_strides(T, H, sx_t, sk_t, 0)
    g = h // HPG
    i = tl.arange(0, C)
    m = i < L
    cs = tl.where(m, cs_rows, cs_last)
    t = t0 + i
    xrow = bidx * sx_b + t * sx_t + h * P
    if MODE == 0:
        w = fast_exp(cs_last - cs) * scale
    else:
        w = fast_exp(cs)
    if not HALVES:
        x = tl.load(x_ptr + xrow[:, None] + p[None, :], mask=m[:, None], other=0.0).to(tl.float32)  # [C, BP]
        if MODE == 1:
            if HAS_Z:
                zz = tl.load(z_ptr + xrow[:, None] + p[None, :], mask=m[:, None], other=0.0).to(tl.float32)
                x = x * zz * fast_sigmoid(zz)
    w = tl.where(m, w, 0.0)
    BH: tl.constexpr = BN // 2
    pa = nb * BH + tl.arange(0, BH)
    krow = bidx * sk_b + t * sk_t + g * N
    ke, ko = load_pairs(k_ptr, krow, m, nb * BN, C, BN, STRIDED)
    if HAS_BIAS:
        ke, ko = add_bias_pairs(ke, ko, kb_ptr + h * N, nb * BN, BN, STRIDED)
    si, co = rotation_tile(rot_ptr, rot_plane, head_angle_rows(bidx, t, h, T, H, A), m, pa, A, C, BH)
    kre = ke * co - ko * si
    kro = ke * si + ko * co
    if HALVES:
        # a transposed register operand crashes Triton 3.6's FMA dots on Blackwell ("Illegal shared layout"),
        # so the A operand is loaded transposed from memory instead.
        xt = tl.load(x_ptr + xrow[None, :] + p[:, None], mask=m[None, :], other=0.0).to(tl.float32)  # [BP, C]
        if MODE == 1:
            if HAS_Z:
                zt = tl.load(z_ptr + xrow[None, :] + p[:, None], mask=m[None, :], other=0.0).to(tl.float32)
                xt = xt * zt * fast_sigmoid(zt)
        xw = xt * w[None, :]
        # and a re-interleaved (joined) B operand is illegal there too: one dot per half, strided stores
        return tl.dot(xw, kre, input_precision=PREC), tl.dot(xw, kro, input_precision=PREC)  # [BP, BN/2] x2
    else:
        xw = tl.trans(x * w[:, None]).to(DOT_DT)  # [BP, C]
        kr = join_pairs(kre, kro, C, BN)  # [C, BN]
        s_loc = tl.dot(xw, kr.to(DOT_DT), input_precision=PREC)  # [BP, BN]
        return s_loc, s_loc


@triton.jit
def store_state_block(st_ptr, base, a, b, p, nb, N: tl.constexpr, BN: tl.constexpr, HALVES: tl.constexpr,
                      STRIDED: tl.constexpr):
    """Store what :func:`local_chunk_state` returns into the (P, N) state at ``base``: fp32, or rounded to nearest
    into a 16-bit buffer (``SisoConfig.states16``: the rounding the output kernel's dot applies to an fp32 one).
    HALVES: the halves by two stride-2 stores (STRIDED) or re-interleaved into one [BP, BN] tile."""
    rows = st_ptr + base + p[:, None] * N
    if HALVES and STRIDED:
        ne = nb * BN + 2 * tl.arange(0, BN // 2)
        tl.store(rows + ne[None, :], a)
        tl.store(rows + ne[None, :] + 1, b)
    else:
        if HALVES:
            a = join_pairs(a, b, a.shape[0], BN)
        n = nb * BN + tl.arange(0, BN)
        tl.store(rows + n[None, :], a.to(st_ptr.dtype.element_ty))


@triton.jit
def load_state_block(st_ptr, base, p, nb, N: tl.constexpr, BN: tl.constexpr, HALVES: tl.constexpr,
                     STRIDED: tl.constexpr):
    """The inverse of :func:`store_state_block`."""
    if HALVES:
        return state_halves(st_ptr, base, p, nb, N, BN, STRIDED)
    else:
        n = nb * BN + tl.arange(0, BN)
        x = tl.load(st_ptr + base + p[:, None] * N + n[None, :])
        return x, x


@triton.jit
def state_block_program(H, N: tl.constexpr, P: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr):
    """(outer index, head, N block, state rows) of this program in a 1-D grid of outer-major, then head, then (N
    block, P block) fastest: concurrent CTAs read neighbouring parts of the same DRAM rows of v and k ((B, T, H, P)
    rows are H·P wide)."""
    pid = tl.program_id(0).to(tl.int64)
    j = pid % ((N // BN) * (P // BP))
    outer = pid // ((N // BN) * (P // BP))
    return outer // H, outer % H, j // (P // BP), (j % (P // BP)) * BP + tl.arange(0, BP)


@triton.jit(do_not_specialize=["T", "rot_plane", "coef_plane"])
def chunk_state_kernel(x_ptr, z_ptr, k_ptr, kb_ptr, coef_ptr, coef_plane, rot_ptr, rot_plane, st_ptr,
                       table_ptr, T, sx_t, sk_t, H, HPG, A,
                       N: tl.constexpr, P: tl.constexpr, C: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                       MODE: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                       HALVES: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, STRIDED: tl.constexpr):
    """The local state (MODE 0) or local dS (MODE 1) of every chunk, :func:`local_chunk_state`, into st_ptr (grid:
    chunks × H × blocks)."""
    c, h, nb, p = state_block_program(H, N, P, BN, BP)
    _, _, s_h, s_b, _ = batch_strides(T, H, sx_t, sk_t, 0)
    bidx, t0, L, _ = chunk_row(table_ptr, c)
    cs_last, cs_rows, _, scale = coefficient_loads(coef_ptr, coef_plane, bidx * s_b + h * s_h, t0, L, C)
    a, b = local_chunk_state(x_ptr, z_ptr, k_ptr, kb_ptr, rot_ptr, rot_plane, bidx, t0, L, cs_last, cs_rows, scale, h,
                             nb, p, T, sx_t, sk_t, H, HPG, A, N, P, C, BN, BP, MODE, HAS_Z, HAS_BIAS, HALVES, DOT_DT,
                             PREC, STRIDED)
    store_state_block(st_ptr, (c * H + h) * P * N, a, b, p, nb, N, BN, HALVES, STRIDED)


@triton.jit(do_not_specialize=["T", "rot_plane", "coef_plane", "max_chunks", "kend_stride"])
def chunk_state_scan_kernel(x_ptr, z_ptr, k_ptr, kb_ptr, coef_ptr, coef_plane, rot_ptr, rot_plane, st_ptr, g_ptr,
                            init_ptr, final_ptr, fwd_ptr, fwd16_ptr, kend_ptr, table_ptr, seq_table_ptr, max_chunks,
                            kend_stride, T, sx_t, sk_t, H, HPG, A,
                            N: tl.constexpr, P: tl.constexpr, C: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                            MODE: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                            HALVES: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr,
                            HAS_INIT: tl.constexpr, REVERSE: tl.constexpr, KEND: tl.constexpr, STRIDED: tl.constexpr,
                            COPY_S: tl.constexpr, PREFETCH: tl.constexpr):
    """``chunk_state_kernel`` and ``common.state_passing`` in one pass (``function._scan_states``): a program per
    (sequence, head, N block, P block) walks the sequence's chunks in order (REVERSE: from the last), stores the
    running state S entering the chunk (REVERSE: the dS leaving it) into st_ptr, then S ← e^{g_c}·S + the chunk's
    local term (``local_chunk_state``; g_ptr: (nchunks, H) total log-decay per chunk). Start: init_ptr (NS, H, P, N)
    or 0; end: final_ptr. The local terms never go to memory, where the two-pass form writes them, then reads and
    rewrites them: one fp32 state read and write less, at NS·H·(N/BN)·(P/BP) programs instead of
    chunks·H·(N/BN)·(P/BP).

    KEND (the reverse pass, ``SisoConfig.bwd_states16``; interleaved blocks): the pass also reads the fp32 state
    entering each chunk (fwd_ptr, the backward's recomputed one), stores its block's share of e^{g_c}·⟨dS leaving c,
    S entering c⟩ (a term of the decay gradient; kend_ptr: (blocks, nchunks, H), block stride kend_stride, summed by
    ``decay_grad_kernel``) and that state rounded into the 16-bit fwd16_ptr, so that the per-chunk gradient kernels,
    whose dots round both states to their 16-bit dtype anyway, read two 16-bit buffers (st_ptr is one then too)
    instead of two fp32 ones. Without COPY_S fwd_ptr is already such a copy (kept from the forward,
    ``SisoTritonFn``'s ``save_states``): the partials come from it, and nothing is copied."""
    tl.static_assert(not (KEND and HALVES), "KEND: the 16-bit-dot path's interleaved blocks only")
    s, h, nb, p = state_block_program(H, N, P, BN, BP)
    first = tl.load(seq_table_ptr + s * 2).to(tl.int64)
    n = tl.load(seq_table_ptr + s * 2 + 1)
    if HAS_INIT:
        xa, xb = load_state_block(init_ptr, (s * H + h) * P * N, p, nb, N, BN, HALVES, STRIDED)
    elif HALVES:
        xa = tl.zeros((BP, BN // 2), dtype=tl.float32)
        xb = tl.zeros((BP, BN // 2), dtype=tl.float32)
    else:
        xa = tl.zeros((BP, BN), dtype=tl.float32)
        xb = xa
    sx_b, sk_b, s_h, s_b, sa_b = batch_strides(T, H, sx_t, sk_t, 0)
    # PREFETCH (``SisoConfig.scan_prefetch``): each step's loads wait on its table row, and the select that forms cs
    # (which every weight of the step needs) on the coefficient loads that wait on the row in turn. 1: the row is
    # loaded a step ahead; 2: the row two steps ahead and the coefficients one (the walk's last steps load the last
    # chunk's again, unused)
    if PREFETCH >= 1:
        bidx1, t01, L1, t_end1 = chunk_row(table_ptr, walk_chunk(first, n, 0, REVERSE))
    if PREFETCH == 2:
        cl1, cr1, gamma1, sc1 = coefficient_loads(coef_ptr, coef_plane, bidx1 * s_b + h * s_h, t01, L1, C)
        bidx2, t02, L2, t_end2 = chunk_row(table_ptr, walk_chunk(first, n, 1, REVERSE))
    # the trip count is a host int (the longest sequence's chunk count), as in common.state_passing: a loop bound
    # loaded from memory is fine compiled but not in the interpreter
    for jj in range(max_chunks):
        if jj < n:
            c = walk_chunk(first, n, jj, REVERSE)
            if PREFETCH == 0:
                bidx, t0, L, t_end = chunk_row(table_ptr, c)
                cs_last, cs_rows, gamma, scale = coefficient_loads(coef_ptr, coef_plane, bidx * s_b + h * s_h, t0, L, C)
            elif PREFETCH == 1:
                bidx, t0, L = bidx1, t01, L1
                cs_last, cs_rows, gamma, scale = coefficient_loads(coef_ptr, coef_plane, bidx * s_b + h * s_h, t0, L, C)
                bidx1, t01, L1, t_end1 = chunk_row(table_ptr, walk_chunk(first, n, jj + 1, REVERSE))
            else:
                bidx, t0, L, cs_last, cs_rows, scale = bidx1, t01, L1, cl1, cr1, sc1
                bidx1, t01, L1 = bidx2, t02, L2
                cl1, cr1, gamma1, sc1 = coefficient_loads(coef_ptr, coef_plane, bidx1 * s_b + h * s_h, t01, L1, C)
                bidx2, t02, L2, t_end2 = chunk_row(table_ptr, walk_chunk(first, n, jj + 2, REVERSE))
            la, lb = local_chunk_state(x_ptr, z_ptr, k_ptr, kb_ptr, rot_ptr, rot_plane, bidx, t0, L, cs_last,
                                       cs_rows, scale, h, nb, p, T, sx_t, sk_t, H, HPG, A, N, P, C, BN, BP, MODE,
                                       HAS_Z, HAS_BIAS, HALVES, DOT_DT, PREC, STRIDED)
            decay = fast_exp(tl.load(g_ptr + c * H + h))
            if KEND:
                sa, _ = load_state_block(fwd_ptr, (c * H + h) * P * N, p, nb, N, BN, False, False)
                sa = sa.to(tl.float32)
                block = tl.program_id(0) % ((N // BN) * (P // BP))
                tl.store(kend_ptr + block * kend_stride + c * H + h, decay * tl.sum(tl.sum(sa * xa, 1), 0))
                if COPY_S:
                    store_state_block(fwd16_ptr, (c * H + h) * P * N, sa, sa, p, nb, N, BN, False, False)
            store_state_block(st_ptr, (c * H + h) * P * N, xa, xb, p, nb, N, BN, HALVES, STRIDED)
            xa = decay * xa + la
            if HALVES:
                xb = decay * xb + lb
            else:
                xb = xa
    store_state_block(final_ptr, (s * H + h) * P * N, xa, xb, p, nb, N, BN, HALVES, STRIDED)


@triton.jit
def rotated_q_halves(q_ptr, qb_ptr, rot_ptr, rot_plane, qrow, arow, m, nb, bias_off, A,
                     C: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr, STRIDED: tl.constexpr):
    """N block ``nb`` of a chunk's rows of q̃ = R(θ)(q + b) as (even, odd) [C, BN/2] fp32 halves."""
    BH: tl.constexpr = BN // 2
    qe, qo = load_pairs(q_ptr, qrow, m, nb * BN, C, BN, STRIDED)
    if HAS_BIAS:
        qe, qo = add_bias_pairs(qe, qo, qb_ptr + bias_off, nb * BN, BN, STRIDED)
    si, co = rotation_tile(rot_ptr, rot_plane, arow, m, nb * BH + tl.arange(0, BH), A, C, BH)
    return qe * co - qo * si, qe * si + qo * co


@triton.jit
def rotated_qk_halves(q_ptr, k_ptr, qb_ptr, kb_ptr, rot_ptr, rot_plane, qrow, arow, m, scale, nb, bias_off, A,
                      C: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr, STRIDED: tl.constexpr):
    """``rotated_qk_block`` on even/odd halves (fp32, [C, BN/2] each, never re-interleaved): q̃ₑ, q̃ₒ, (k̃·scale)ₑ,
    (k̃·scale)ₒ and the block's part of q·k. A dot over the block is the sum of the two halves' dots."""
    BH: tl.constexpr = BN // 2
    qe, qo = load_pairs(q_ptr, qrow, m, nb * BN, C, BN, STRIDED)
    ke, ko = load_pairs(k_ptr, qrow, m, nb * BN, C, BN, STRIDED)
    if HAS_BIAS:
        qe, qo = add_bias_pairs(qe, qo, qb_ptr + bias_off, nb * BN, BN, STRIDED)
        ke, ko = add_bias_pairs(ke, ko, kb_ptr + bias_off, nb * BN, BN, STRIDED)
    si, co = rotation_tile(rot_ptr, rot_plane, arow, m, nb * BH + tl.arange(0, BH), A, C, BH)
    sc = scale[:, None]
    return (qe * co - qo * si, qe * si + qo * co, (ke * co - ko * si) * sc, (ke * si + ko * co) * sc,
            tl.sum(qe * ke + qo * ko, 1))


@triton.jit
def rotated_q_block(q_ptr, qb_ptr, rot_ptr, rot_plane, qrow, arow, m, nb, bias_off, A,
                    C: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr):
    """N block ``nb`` of a chunk's rows of q̃ = R(θ)(q + b) as a [C, BN] fp32 tile (pairs interleaved)."""
    qe, qo = rotated_q_halves(q_ptr, qb_ptr, rot_ptr, rot_plane, qrow, arow, m, nb, bias_off, A, C, BN, HAS_BIAS,
                              False)
    return join_pairs(qe, qo, C, BN)


@triton.jit
def rotated_qk_block(q_ptr, k_ptr, qb_ptr, kb_ptr, rot_ptr, rot_plane, qrow, arow, m, scale, nb, bias_off, A,
                     C: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_DT: tl.constexpr):
    """N block ``nb`` of a chunk's rows: q̃ and k̃·scale as dot operands [C, BN] in DOT_DT, and the block's part
    of the unrotated biased q·k [C] in fp32 (equal to q̃·k̃: both rotate by the same θ_t)."""
    qe, qo, ke, ko, qk = rotated_qk_halves(q_ptr, k_ptr, qb_ptr, kb_ptr, rot_ptr, rot_plane, qrow, arow, m, scale,
                                           nb, bias_off, A, C, BN, HAS_BIAS, False)
    return join_pairs(qe, qo, C, BN).to(DOT_DT), join_pairs(ke, ko, C, BN).to(DOT_DT), qk


@triton.jit
def state_halves(st_ptr, base, p, nb, N: tl.constexpr, BN: tl.constexpr, STRIDED: tl.constexpr):
    """The (even, odd) state columns of N block ``nb`` for rows ``p``: two [BP, BN/2] fp32 tiles, from two stride-2
    loads (STRIDED) or one contiguous (vectorised) load split in registers."""
    rows = st_ptr + base + p[:, None] * N
    if STRIDED:
        ne = nb * BN + 2 * tl.arange(0, BN // 2)
        return tl.load(rows + ne[None, :]), tl.load(rows + ne[None, :] + 1)
    else:
        n = nb * BN + tl.arange(0, BN)
        return split_pairs(tl.load(rows + n[None, :]), p.shape[0], BN // 2)


@triton.jit(do_not_specialize=["T", "rot_plane", "coef_plane"])
def output_kernel(q_ptr, k_ptr, v_ptr, z_ptr, o_ptr, qb_ptr, kb_ptr, d_ptr, coef_ptr, coef_plane, rot_ptr,
                  rot_plane, st_ptr, table_ptr, T, sq_t, sv_t, H, HPG, A,
                  N: tl.constexpr, P: tl.constexpr, C: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                  HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                  HALVES: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, STRIDED: tl.constexpr,
                  UNROLL_QK: tl.constexpr, UNROLL_S: tl.constexpr):
    # UNROLL_QK, UNROLL_S (``SisoConfig.output_unroll``): unroll factors of the two loops over N blocks (the
    # scores, the inter-chunk term), so the next block's loads can issue before this block's dots (1: a loop)
    sq_b, sv_b, s_h, s_b, _ = batch_strides(T, H, sq_t, sv_t, 0)
    pid = tl.program_id(0).to(tl.int64)  # 1-D grid: chunk, head, P block (fastest)
    pb = pid % (P // BP)
    c = pid // (P // BP) // H
    h = pid // (P // BP) % H
    bidx, t0, L, t_end = chunk_row(table_ptr, c)
    g = h // HPG
    i, m, gamma, scale, cs, cs_last = chunk_coefficients(coef_ptr, coef_plane, bidx * s_b + h * s_h, t0, L, C)
    t = t0 + i
    p = pb * BP + tl.arange(0, BP)
    qrow = bidx * sq_b + t * sq_t + g * N
    arow = head_angle_rows(bidx, t, h, T, H, A)
    # Two passes over the N blocks keep one C×C or C×BP accumulator live at a time (the rotated q is rebuilt in
    # the second): 1) the scores Q̃(K̃·scale)ᵀ, consumed at once by the intra-chunk product; 2) the inter-chunk
    # term e^{cs}⊙(Q̃ Sᵀ) accumulated into the same output tile (q̃ rows pre-scaled by e^{cs} ≤ 1).
    acc_qk = tl.zeros([C, C], dtype=tl.float32)
    qk = tl.zeros([C], dtype=tl.float32)
    for nb in tl.range(N // BN, loop_unroll_factor=UNROLL_QK):
        if HALVES:
            qre, qro, kke, kko, qk_block = rotated_qk_halves(q_ptr, k_ptr, qb_ptr, kb_ptr, rot_ptr,
                                                             rot_plane, qrow, arow, m, scale,
                                                             nb, h * N, A, C, BN, HAS_BIAS, STRIDED)
            acc_qk = tl.dot(qre, tl.trans(kke), acc=acc_qk, input_precision=PREC)
            acc_qk = tl.dot(qro, tl.trans(kko), acc=acc_qk, input_precision=PREC)
        else:
            qr, kk, qk_block = rotated_qk_block(q_ptr, k_ptr, qb_ptr, kb_ptr, rot_ptr, rot_plane,
                                                qrow, arow, m, scale, nb, h * N, A, C, BN, HAS_BIAS, DOT_DT)
            acc_qk += tl.dot(qr, tl.trans(kk), input_precision=PREC)
        qk += qk_block
    vrow = bidx * sv_b + t * sv_t + h * P
    v = tl.load(v_ptr + vrow[:, None] + p[None, :], mask=m[:, None], other=0.0)
    diff = cs[:, None] - cs[None, :]
    causal = i[None, :] < i[:, None]
    mm = tl.where(causal, fast_exp(tl.minimum(diff, 0.0)), 0.0) * acc_qk
    y = tl.dot(mm.to(DOT_DT), v.to(DOT_DT), input_precision=PREC)
    ecs = fast_exp(cs)
    for nb in tl.range(N // BN, loop_unroll_factor=UNROLL_S):
        if HALVES:
            qse, qso = rotated_q_halves(q_ptr, qb_ptr, rot_ptr, rot_plane, qrow, arow, m, nb,
                                        h * N, A, C, BN, HAS_BIAS, STRIDED)
            se, so = state_halves(st_ptr, (c * H + h) * P * N, p, nb, N, BN, STRIDED)
            y = tl.dot(qse * ecs[:, None], tl.trans(se), acc=y, input_precision=PREC)
            y = tl.dot(qso * ecs[:, None], tl.trans(so), acc=y, input_precision=PREC)
        else:
            qs = rotated_q_block(q_ptr, qb_ptr, rot_ptr, rot_plane, qrow, arow, m, nb, h * N, A,
                                 C, BN, HAS_BIAS) * ecs[:, None]
            n = nb * BN + tl.arange(0, BN)
            s = tl.load(st_ptr + (c * H + h) * P * N + p[:, None] * N + n[None, :]).to(DOT_DT)  # [BP, BN]
            y = tl.dot(qs.to(DOT_DT), tl.trans(s), acc=y, input_precision=PREC)
    diag = gamma * qk
    if HAS_D:
        diag += tl.load(d_ptr + h).to(tl.float32)
    y += diag[:, None] * v.to(tl.float32)
    if HAS_Z:
        zz = tl.load(z_ptr + vrow[:, None] + p[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        y = y * zz * fast_sigmoid(zz)
    tl.store(o_ptr + vrow[:, None] + p[None, :], y.to(o_ptr.dtype.element_ty), mask=m[:, None])
