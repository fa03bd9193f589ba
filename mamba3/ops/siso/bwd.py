"""SISO backward: the two per-chunk gradient kernels and the scan of d adt (host orchestration: ``function.py``).

Per chunk (positions i, j; M_ij = e^{cs_i−cs_j}·[j<i]; kk_j = scale_j·k̃_j; S = state entering the chunk;
dSe = gradient arriving at the chunk's end, from the reverse state pass; dy = dO ⊙ silu(z)):

``bwd_dv_kernel`` — grid (chunk, head), loops over N blocks to form Q̃KKᵀ, Q̃Sᵀ, KK·dSeᵀ, ⟨dSe, S⟩:
    dv_j  = Σ_i M_ij(q̃_i·kk_j)·dy_i + e^{cs_L−cs_j}·dSe kk_j + (D + γ_j q̂_j·k̂_j)·dy_j
    dz    = dO ⊙ y ⊙ σ(z)(1 + z(1−σ(z)))   (y recomputed); with z, dy itself is stored for bwd_dqk
    dD    = Σ dy·v (per chunk partials), dγ(diag) = (dy_i·v_i)(q̂_i·k̂_i)
    d adt = reverse cumsum (within the chunk) of the gradient w.r.t. cs: inter e^{cs_i}·dy_i·S q̃_i, intra row sums
            minus column sums of M∘(Q̃KKᵀ)∘(dY Vᵀ), minus the K-into-state term, plus at the last position
            e^{cs_L}⟨dSe, S⟩ and the K-into-state total. No cross-chunk cumsum is needed: cs restarts every chunk.
            bwd_dv stores the per-token terms; ``decay_grad_kernel`` (one light program per (chunk, head)) scans them.

``bwd_dqk_kernel`` — grid (chunk, q/k group, head split, N block): loops over its share of the group's heads and
    sums dq, dk over them in registers; the head splits write fp32 partials summed on the host (no atomics). It
    reads dy (bwd_dv's, or dO itself without z):
    dq̃ = e^{cs}⊙(dY S) + (M∘dY Vᵀ) KK,  dkk = (M∘dY Vᵀ)ᵀ Q̃ + e^{cs_L−cs}⊙(V dSe),  dk̃ = scale⊙dkk
    dscale_j = dkk_j·k̃_j (partial per N block), dθ = pair-wise dq̃·∂q̃/∂θ + dk̃·∂k̃/∂θ stored per token (its reverse
    cumsums within and across chunks are ``common.cumsum.angle_backward``'s),
    dq̂ = R(θ)ᵀdq̃ + γ(dy·v)·k̂,  dk̂ = R(θ)ᵀdk̃ + γ(dy·v)·q̂;  bias gradients as per-(chunk, head) partial sums.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.tiles import (add_bias_pairs, batch_strides, chunk_row, chunk_coefficients, fast_exp, fast_sigmoid,
                            head_angle_rows, join_pairs, load_pairs, reverse_cumsum, rotation_tile, split16, split_pairs,
                            store_pairs)
from .fwd import rotated_qk_block, rotated_qk_halves, state_halves


@triton.jit
def a1_offsets(c, h, H, pb, NPB: tl.constexpr, i, C: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Element offsets of the C×C tile of chunk c, head h, P block pb (of NPB) in the (nchunks, H, NPB, C, C) buffer
    of M∘(dY Vᵀ) that bwd_dv stores and bwd_dqk loads (``SisoConfig.bwd_store_a1``, ``bwd_store_a1_fp32``; NPB > 1
    where ``bwd_store_a1_blocks``: each P block's share); i = tl.arange(0, C). TRANSPOSED: those of the tile's
    transpose (the same buffer, read with swapped offsets)."""
    base = ((c * H + h) * NPB + pb) * C
    if TRANSPOSED:
        return (base + i[None, :]) * C + i[:, None]
    else:
        return (base + i[:, None]) * C + i[None, :]


@triton.jit
def load_a1(a1_ptr, c, h, H, NPB: tl.constexpr, i, C: tl.constexpr, TRANSPOSED: tl.constexpr):
    """M∘(dY Vᵀ) of chunk c, head h (or its transpose) from bwd_dv's buffer: the sum of the NPB P blocks' shares (fp32
    where NPB > 1; with one block, the tile itself in the buffer's dtype)."""
    acc = tl.load(a1_ptr + a1_offsets(c, h, H, 0, NPB, i, C, TRANSPOSED))
    for pb in tl.static_range(1, NPB):
        acc += tl.load(a1_ptr + a1_offsets(c, h, H, pb, NPB, i, C, TRANSPOSED))
    return acc


@triton.jit(do_not_specialize=["T", "NB_B", "sd_n", "rot_plane", "coef_plane"])
def bwd_dv_kernel(q_ptr, k_ptr, v_ptr, z_ptr, do_ptr, dv_ptr, dz_ptr, dy_ptr, qb_ptr, kb_ptr, d_ptr, coef_ptr,
                  coef_plane, rot_ptr, rot_plane, st_ptr, dst_ptr, ddp_ptr, dgam_ptr, gcs_ptr, bterm_ptr, kend_ptr,
                  a1_ptr, table_ptr,
                  T, NB_B, sd_n, sq_t, sv_t, H, HPG, A,
                  N: tl.constexpr, P: tl.constexpr, C: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                  HAS_Z: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                  HALVES: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, KEND: tl.constexpr,
                  STORE_A1: tl.constexpr, STRIDED: tl.constexpr):
    # STRIDED: HALVES's pair tiles are loaded by stride-2 accesses (``SisoConfig.contiguous_halves`` off), else as
    # contiguous tiles split in registers
    # KEND: this kernel forms e^{cs_L}⟨dSe, S⟩ from fp32 states; without it the reverse state scan did
    # (``SisoConfig.bwd_states16``) and st / dst are 16-bit copies (the dots round them to DOT_DT anyway).
    # STORE_A1 (``SisoConfig.bwd_store_a1`` on 16-bit dots, ``bwd_store_a1_fp32`` on fp32 ones; one P block, or
    # several on fp32 ones with ``bwd_store_a1_blocks``): M∘(dY Vᵀ) of the chunk and head (this P block's share), in
    # a1_ptr's dtype (DOT_DT), for bwd_dqk, which would otherwise form it again for every N block
    sq_b, sv_b, s_h, s_b, _ = batch_strides(T, H, sq_t, sv_t, 0)
    sp_n = NB_B * s_b
    # 1-D grid, chunk-major then head then P block (fastest): concurrent CTAs share the DRAM rows of v/z/dO
    pid = tl.program_id(0).to(tl.int64)
    pb = pid % (P // BP)
    c = pid // (P // BP) // H
    h = pid // (P // BP) % H
    bidx, t0, L, t_end = chunk_row(table_ptr, c)
    g = h // HPG
    i, m, gamma, scale, cs, cs_last = chunk_coefficients(coef_ptr, coef_plane, bidx * s_b + h * s_h, t0, L, C)
    rev = fast_exp(cs_last - cs)
    ecs = fast_exp(cs)
    t = t0 + i
    p = pb * BP + tl.arange(0, BP)
    qrow = bidx * sq_b + t * sq_t + g * N
    arow = head_angle_rows(bidx, t, h, T, H, A)
    acc_qk = tl.zeros([C, C], dtype=tl.float32)
    acc_qs = tl.zeros([C, BP], dtype=tl.float32)
    acc_kd = tl.zeros([C, BP], dtype=tl.float32)
    qk = tl.zeros([C], dtype=tl.float32)
    sdot = tl.zeros([BP], dtype=tl.float32)
    sbase = (c * H + h) * P * N
    for nb in range(N // BN):
        if HALVES:
            qre, qro, kke, kko, qk_block = rotated_qk_halves(q_ptr, k_ptr, qb_ptr, kb_ptr, rot_ptr,
                                                             rot_plane, qrow, arow, m, scale,
                                                             nb, h * N, A, C, BN, HAS_BIAS, STRIDED)
            se, so = state_halves(st_ptr, sbase, p, nb, N, BN, STRIDED)  # [BP, BN/2] fp32 each
            dse, dso = state_halves(dst_ptr, sbase, p, nb, N, BN, STRIDED)
            if KEND:
                sdot += tl.sum(se * dse + so * dso, 1)
            acc_qk = tl.dot(qre, tl.trans(kke), acc=acc_qk, input_precision=PREC)
            acc_qk = tl.dot(qro, tl.trans(kko), acc=acc_qk, input_precision=PREC)
            acc_qs = tl.dot(qre, tl.trans(se), acc=acc_qs, input_precision=PREC)
            acc_qs = tl.dot(qro, tl.trans(so), acc=acc_qs, input_precision=PREC)
            acc_kd = tl.dot(kke, tl.trans(dse), acc=acc_kd, input_precision=PREC)
            acc_kd = tl.dot(kko, tl.trans(dso), acc=acc_kd, input_precision=PREC)
        else:
            qr, kk, qk_block = rotated_qk_block(q_ptr, k_ptr, qb_ptr, kb_ptr, rot_ptr, rot_plane,
                                                qrow, arow, m, scale, nb, h * N, A, C, BN, HAS_BIAS, DOT_DT)
            n = nb * BN + tl.arange(0, BN)
            s = tl.load(st_ptr + sbase + p[:, None] * N + n[None, :])  # [BP, BN] fp32
            dse = tl.load(dst_ptr + sbase + p[:, None] * N + n[None, :])
            if KEND:
                sdot += tl.sum(s * dse, 1)
            acc_qk += tl.dot(qr, tl.trans(kk), input_precision=PREC)
            acc_qs += tl.dot(qr, tl.trans(s.to(DOT_DT)), input_precision=PREC)
            acc_kd += tl.dot(kk, tl.trans(dse.to(DOT_DT)), input_precision=PREC)
        qk += qk_block
    vrow = bidx * sv_b + t * sv_t + h * P
    v = tl.load(v_ptr + vrow[:, None] + p[None, :], mask=m[:, None], other=0.0)
    vf = v.to(tl.float32)
    do = tl.load(do_ptr + vrow[:, None] + p[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    if HAS_Z:
        zz = tl.load(z_ptr + vrow[:, None] + p[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        sz = fast_sigmoid(zz)
        dy = do * zz * sz
        # kept for bwd_dqk, whose dots take it in DOT_DT anyway: there the gate cost ≈ 17 % of the instructions
        # (the sigmoid is recomputed in every layout dy is used in; sm_90 SASS). Stored in bf16 (bf16 inputs), it
        # takes dz's store layout here, where fp32 (fp32 and fp16 inputs) adds a layout with one more sigmoid.
        tl.store(dy_ptr + vrow[:, None] + p[None, :], dy.to(dy_ptr.dtype.element_ty), mask=m[:, None])
    else:
        dy = do
    diff = cs[:, None] - cs[None, :]
    causal = i[None, :] < i[:, None]
    decay = tl.where(causal, fast_exp(tl.minimum(diff, 0.0)), 0.0)  # M [C, C]
    mm = decay * acc_qk
    diag = gamma * qk
    if HAS_D:
        diag += tl.load(d_ptr + h).to(tl.float32)
    # partial outputs (sums over p): one slab per P block, summed on the host
    part = pb * sp_n
    if HAS_Z:
        y = ecs[:, None] * acc_qs + tl.dot(mm.to(DOT_DT), v.to(DOT_DT), input_precision=PREC) + diag[:, None] * vf
        dz = do * y * sz * (1.0 + zz * (1.0 - sz))
        tl.store(dz_ptr + vrow[:, None] + p[None, :], dz.to(dz_ptr.dtype.element_ty), mask=m[:, None])
    dyd = dy.to(DOT_DT)
    dv = tl.dot(tl.trans(mm.to(DOT_DT)), dyd, input_precision=PREC) + rev[:, None] * acc_kd + diag[:, None] * dy
    tl.store(dv_ptr + vrow[:, None] + p[None, :], dv.to(dv_ptr.dtype.element_ty), mask=m[:, None])
    dyv = tl.sum(dy * vf, 1)
    if HAS_D:
        tl.store(ddp_ptr + pb * sd_n + c * H + h, tl.sum(dyv, 0))
    dbase = bidx * s_b + h * s_h
    tl.store(dgam_ptr + part + dbase + t, dyv * qk, mask=m)
    # intra-chunk decay terms: W = M∘(Q̃KKᵀ)∘(dY Vᵀ); d/dcs_i gets row sums minus column sums
    dyvt = tl.dot(dyd, tl.trans(v.to(DOT_DT)), input_precision=PREC)  # [C, C]
    w = mm * dyvt
    if STORE_A1:  # bwd_dqk's a1, the same expression (its dot rounds it to DOT_DT)
        a1 = decay * dyvt
        tl.store(a1_ptr + a1_offsets(c, h, H, pb, P // BP, i, C, False), a1.to(a1_ptr.dtype.element_ty))
    bterm = rev * tl.sum(vf * acc_kd, 1)
    gcs = ecs * tl.sum(dy * acc_qs, 1) + tl.sum(w, 1) - tl.sum(w, 0)
    # the within-chunk scans that turn these into d adt are decay_grad_kernel's (in this kernel they were masked C×C
    # reductions: tl.cumsum on these dot-derived layouts crashes Triton 3.6's Blackwell TMEM layout pass)
    tl.store(gcs_ptr + part + dbase + t, gcs, mask=m)
    tl.store(bterm_ptr + part + dbase + t, bterm, mask=m)
    if KEND:
        tl.store(kend_ptr + pb * sd_n + c * H + h, fast_exp(cs_last) * tl.sum(sdot, 0))


@triton.jit(do_not_specialize=["T", "NB_B", "sd_n"])
def decay_grad_kernel(gcs_ptr, bterm_ptr, kend_ptr, dadt_ptr, table_ptr, T, NB_B, sd_n, H,
                      NPB: tl.constexpr, NKE: tl.constexpr, C: tl.constexpr):
    """d adt of one (chunk, head) from bwd_dv's per-token partials (NPB P blocks, summed here) and NKE partials of
    the chunk's e^{cs_L}⟨dSe, S⟩ (bwd_dv's per P block, or the reverse state scan's per state block): d adt_r =
    Σ_{i≥r} g_i (the reverse cumsum of the gradient w.r.t. cs) + Σ_{j<r} bterm_j + e^{cs_L}⟨dSe, S⟩. The
    K-into-state term bterm enters cs_L (every r) and −cs_j (r ≤ j), which leaves the exclusive prefix, summed
    from the shifted terms: as the inclusive cumsum minus bterm_r it lost everything at the chunk's last token,
    whose own term (e^0) dwarfs the decayed earlier ones under strong decay (adt = −20: d_adt 0.2 relative)."""
    _, _, s_h, s_b, _ = batch_strides(T, H, 0, 0, 0)
    pid = tl.program_id(0).to(tl.int64)
    c = pid // H
    h = pid % H
    bidx, t0, L, _ = chunk_row(table_ptr, c)
    i = tl.arange(0, C)
    m = i < L
    tok = bidx * s_b + h * s_h + t0 + i
    g = tl.zeros([C], dtype=tl.float32)
    b = tl.zeros([C], dtype=tl.float32)
    kend = 0.0
    for pb in tl.static_range(NPB):
        g += tl.load(gcs_ptr + pb * NB_B * s_b + tok, mask=m, other=0.0)
        b += tl.load(bterm_ptr + pb * NB_B * s_b + tok - 1, mask=m & (i > 0), other=0.0)  # bterm_{r−1}
    for j in tl.static_range(NKE):
        kend += tl.load(kend_ptr + j * sd_n + c * H + h)
    dadt = reverse_cumsum(g) + tl.cumsum(b, 0) + kend
    tl.store(dadt_ptr + tok, dadt, mask=m)


@triton.jit(do_not_specialize=["T", "NB_B"])
def trap_grad_kernel(dsc_ptr, dgam_ptr, dt_ptr, trap_ptr, dang_ptr, dw0_ptr, start_ptr, ddt_ptr, dtrap_ptr,
                     table_ptr, T, NB_B, H, NBK: tl.constexpr, NPB: tl.constexpr, C: tl.constexpr,
                     HAS_ANG: tl.constexpr, HAS_W0: tl.constexpr):
    """d dt and d trap of one (chunk, head) from the per-block partials of dγ (NPB, from bwd_dv) and d scale (NBK,
    from bwd_dqk), with γ_t = λ_t dt_t and scale_t ∋ (1 − λ_{t+1}) dt_{t+1}, λ = σ(trap): the gradient reaching
    (1 − λ_t) dt_t is d scale_{t−1} (d w0 of the input state at a sequence's first token, 0 without one), so
        d dt_t = (dγ_t + dscale_t) λ_t + dprev_t (1 − λ_t) + d dt_t (angles),
        d trap_t = (dγ_t + dscale_t − dprev_t) dt_t λ_t (1 − λ_t).
    One launch for what were ≈ 20 small torch ops (host time)."""
    _, _, s_h, s_b, _ = batch_strides(T, H, 0, 0, 0)
    pid = tl.program_id(0).to(tl.int64)
    c = pid // H
    h = pid % H
    bidx, t0, L, _ = chunk_row(table_ptr, c)
    seq = tl.load(table_ptr + c * 5 + 3)
    start = tl.load(start_ptr + seq)
    i = tl.arange(0, C)
    m = i < L
    t = t0 + i
    tok = bidx * s_b + h * s_h + t
    first = t == start
    dscale = tl.zeros([C], dtype=tl.float32)
    dprev = tl.zeros([C], dtype=tl.float32)
    for nb in tl.static_range(NBK):
        dscale += tl.load(dsc_ptr + nb * NB_B * s_b + tok, mask=m, other=0.0)
        dprev += tl.load(dsc_ptr + nb * NB_B * s_b + tok - 1, mask=m & ~first, other=0.0)
    if HAS_W0:
        dprev = tl.where(first, tl.load(dw0_ptr + seq * H + h), dprev)
    dgt = dscale
    for pb in tl.static_range(NPB):
        dgt += tl.load(dgam_ptr + pb * NB_B * s_b + tok, mask=m, other=0.0)
    lam = tl.sigmoid(tl.load(trap_ptr + tok, mask=m, other=0.0).to(tl.float32))
    dtv = tl.load(dt_ptr + tok, mask=m, other=0.0).to(tl.float32)
    ddt = dgt * lam + dprev * (1.0 - lam)
    if HAS_ANG:
        ddt += tl.load(dang_ptr + tok, mask=m, other=0.0)
    tl.store(ddt_ptr + tok, ddt.to(ddt_ptr.dtype.element_ty), mask=m)
    tl.store(dtrap_ptr + tok, ((dgt - dprev) * dtv * lam * (1.0 - lam)).to(dtrap_ptr.dtype.element_ty), mask=m)


@triton.jit
def exact_dot(a, b, DT: tl.constexpr, PREC: tl.constexpr):
    """a·b with a in DT and b an fp32 tile: fp32 dots take b as is; 16-bit dots take b as hi + lo halves, so the
    rotated q̃ and k̃ keep ~16 mantissa bits (dθ = dq̃ × q̃ − … cancels; b rounded to bf16 gave 1.1e-2 against the
    1e-2 bar at N = P = 64, with the split 4.3e-3)."""
    if DT == tl.float32:
        return tl.dot(a, b, input_precision=PREC)
    else:
        hi, lo = split16(b, DT)
        return tl.dot(a, hi, input_precision=PREC) + tl.dot(a, lo, input_precision=PREC)


@triton.jit(do_not_specialize=["T", "NB_B", "rot_plane", "coef_plane"])
def bwd_dqk_kernel(q_ptr, k_ptr, v_ptr, dy_ptr, dq_ptr, dk_ptr, qb_ptr, kb_ptr, coef_ptr, coef_plane,
                   rot_ptr, rot_plane, st_ptr, dst_ptr, dsc_ptr, dbq_ptr, dbk_ptr, r_ptr, a1_ptr, table_ptr,
                   T, NB_B, sq_t, sv_t, H, HPG, HS, A,
                   N: tl.constexpr, P: tl.constexpr, C: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                   HAS_BIAS: tl.constexpr,
                   HALVES: tl.constexpr, DOT_DT: tl.constexpr, PREC: tl.constexpr, LOAD_A1: tl.constexpr,
                   STRIDED: tl.constexpr):
    # LOAD_A1: M∘(dY Vᵀ) comes from bwd_dv (``SisoConfig.bwd_store_a1`` / ``bwd_store_a1_fp32``; summed over its
    # P blocks' shares with ``bwd_store_a1_blocks``), not from a C×C×P dot and the decay mask here, once per head and
    # N block (HALVES: and its transpose, from a second dot).
    # STRIDED: HALVES's pair tiles are loaded and stored by stride-2 accesses (``SisoConfig.contiguous_halves`` off),
    # else contiguously (split or re-interleaved in registers)
    sq_b, sv_b, s_h, s_b, _ = batch_strides(T, H, sq_t, sv_t, 0)
    sc_n = NB_B * s_b
    # 1-D grid: chunk, then group, then head split, then N block (fastest). The HPG heads of a group are split
    # over HS programs (HPG // HS heads each, summed in registers); with HS > 1 each program writes an fp32
    # partial dq/dk slab (summed on the host), so no atomics are needed.
    pid = tl.program_id(0).to(tl.int64)
    nb = pid % (N // BN)
    rest = pid // (N // BN)
    hsi = rest % HS
    rest = rest // HS
    g = rest % (H // HPG)
    c = rest // (H // HPG)
    HPP = HPG // HS
    bidx, t0, L, t_end = chunk_row(table_ptr, c)
    BH: tl.constexpr = BN // 2
    i = tl.arange(0, C)
    m = i < L
    t = t0 + i
    pa = nb * BH + tl.arange(0, BH)
    n = nb * BN + tl.arange(0, BN)
    qrow = bidx * sq_b + t * sq_t + g * N
    dq_e = tl.zeros([C, BH], dtype=tl.float32)
    dq_o = tl.zeros([C, BH], dtype=tl.float32)
    dk_e = tl.zeros([C, BH], dtype=tl.float32)
    dk_o = tl.zeros([C, BH], dtype=tl.float32)
    for hh in range(HPP):
        h = g * HPG + hsi * HPP + hh
        i2, m2, gamma, scale, cs, cs_last = chunk_coefficients(coef_ptr, coef_plane, bidx * s_b + h * s_h, t0, L, C)
        rev = fast_exp(cs_last - cs)
        ecs = fast_exp(cs)
        vrow = bidx * sv_b + t * sv_t + h * P
        sbase = (c * H + h) * P * N
        # sums over p, one BP slab at a time: dY Vᵀ, dY S, V dSe, dy·v
        dyvt = tl.zeros([C, C], dtype=tl.float32)
        dyvt_t = tl.zeros([C, C], dtype=tl.float32)
        dq_in = tl.zeros([C, BN], dtype=tl.float32)
        dk_in = tl.zeros([C, BN], dtype=tl.float32)
        # HALVES (fp32 operands): even/odd halves as separate dot operands, never re-interleaved into one and no
        # transposed register operands: Triton 3.6's FMA dots on Blackwell reject both ("Illegal shared layout").
        # (Splitting a contiguously loaded tile before the rotation, STRIDED off, compiles on every arch.)
        dq_in_e = tl.zeros([C, BH], dtype=tl.float32)
        dq_in_o = tl.zeros([C, BH], dtype=tl.float32)
        dk_in_e = tl.zeros([C, BH], dtype=tl.float32)
        dk_in_o = tl.zeros([C, BH], dtype=tl.float32)
        dyv = tl.zeros([C], dtype=tl.float32)
        for pb in range(P // BP):
            p = pb * BP + tl.arange(0, BP)
            v = tl.load(v_ptr + vrow[:, None] + p[None, :], mask=m[:, None], other=0.0)
            dy = tl.load(dy_ptr + vrow[:, None] + p[None, :], mask=m[:, None], other=0.0).to(tl.float32)
            dyv += tl.sum(dy * v.to(tl.float32), 1)
            dyd = dy.to(DOT_DT)
            vd = v.to(DOT_DT)
            if not LOAD_A1:
                dyvt += tl.dot(dyd, tl.trans(vd), input_precision=PREC)
                if HALVES:
                    dyvt_t += tl.dot(vd, tl.trans(dyd), input_precision=PREC)
            if HALVES:
                se, so = state_halves(st_ptr, sbase, p, nb, N, BN, STRIDED)
                dse, dso = state_halves(dst_ptr, sbase, p, nb, N, BN, STRIDED)
                dq_in_e += tl.dot(dyd, se, input_precision=PREC)
                dq_in_o += tl.dot(dyd, so, input_precision=PREC)
                dk_in_e += tl.dot(vd, dse, input_precision=PREC)
                dk_in_o += tl.dot(vd, dso, input_precision=PREC)
            else:
                s = tl.load(st_ptr + sbase + p[:, None] * N + n[None, :]).to(DOT_DT)  # [BP, BN]
                dse = tl.load(dst_ptr + sbase + p[:, None] * N + n[None, :]).to(DOT_DT)
                dq_in += tl.dot(dyd, s, input_precision=PREC)
                dk_in += tl.dot(vd, dse, input_precision=PREC)
        dqk = gamma * dyv
        if not LOAD_A1:
            diff = cs[:, None] - cs[None, :]
            a1 = tl.where(i[None, :] < i[:, None], fast_exp(tl.minimum(diff, 0.0)), 0.0) * dyvt
        # the group's q/k rows are re-read for every head (L1/L2 hits) instead of held across the head loop:
        # 32 fewer live registers per thread at 8 warps
        qe, qo = load_pairs(q_ptr, qrow, m, nb * BN, C, BN, STRIDED)
        ke, ko = load_pairs(k_ptr, qrow, m, nb * BN, C, BN, STRIDED)
        if HAS_BIAS:
            qe, qo = add_bias_pairs(qe, qo, qb_ptr + h * N, nb * BN, BN, STRIDED)
            ke, ko = add_bias_pairs(ke, ko, kb_ptr + h * N, nb * BN, BN, STRIDED)
        arow = head_angle_rows(bidx, t, h, T, H, A)  # rows of the sin/cos planes and of R
        si, co = rotation_tile(rot_ptr, rot_plane, arow, m, pa, A, C, BH)
        qre = qe * co - qo * si
        qro = qe * si + qo * co
        kre = ke * co - ko * si
        kro = ke * si + ko * co
        if HALVES:
            if LOAD_A1:
                a1 = load_a1(a1_ptr, c, h, H, P // BP, i, C, False)
                a1t = load_a1(a1_ptr, c, h, H, P // BP, i, C, True)
            else:
                # (M∘dY Vᵀ)ᵀ = Mᵀ∘(V dYᵀ) formed directly (one more C×C×P dot) instead of a transposed operand
                a1t = tl.where(i[:, None] < i[None, :], fast_exp(tl.minimum(-diff, 0.0)), 0.0) * dyvt_t
            dqe = ecs[:, None] * dq_in_e + tl.dot(a1, kre * scale[:, None], input_precision=PREC)
            dqo = ecs[:, None] * dq_in_o + tl.dot(a1, kro * scale[:, None], input_precision=PREC)
            dkke = tl.dot(a1t, qre, input_precision=PREC) + rev[:, None] * dk_in_e
            dkko = tl.dot(a1t, qro, input_precision=PREC) + rev[:, None] * dk_in_o
        else:
            # 16-bit dots on interleaved pair tiles; q̃ and k̃·scale split into hi + lo (exact_dot). Splitting
            # (M∘dY Vᵀ) and the states as well gained little (3.4e-3 against 4.3e-3 for dθ) and nearly doubled the
            # register spills (AOT, sm_90: 1084 against 580 bytes).
            if LOAD_A1:
                ad = load_a1(a1_ptr, c, h, H, P // BP, i, C, False)  # one P block here: the tile in DOT_DT
            else:
                ad = a1.to(DOT_DT)
            dqr = ecs[:, None] * dq_in + exact_dot(ad, join_pairs(kre, kro, C, BN) * scale[:, None], DOT_DT, PREC)
            dkk = exact_dot(tl.trans(ad), join_pairs(qre, qro, C, BN), DOT_DT, PREC) + rev[:, None] * dk_in
            dqe, dqo = split_pairs(dqr, C, BH)
            dkke, dkko = split_pairs(dkk, C, BH)
        tl.store(dsc_ptr + nb * sc_n + bidx * s_b + h * s_h + t, tl.sum(dkke * kre + dkko * kro, 1), mask=m)
        dke = dkke * scale[:, None]
        dko = dkko * scale[:, None]
        dth = (dqo * qre - dqe * qro) + (dko * kre - dke * kro)
        amask = m[:, None] & (pa < A)[None, :]
        tl.store(r_ptr + arow[:, None] + pa[None, :], dth, mask=amask)
        # rows i ≥ L are zeros already (dy, v, q, k load zeros there), as the bias sums need
        gqe = dqe * co + dqo * si + dqk[:, None] * ke
        gqo = dqo * co - dqe * si + dqk[:, None] * ko
        gke = dke * co + dko * si + dqk[:, None] * qe
        gko = dko * co - dke * si + dqk[:, None] * qo
        if HAS_BIAS:
            bb = (c * H + h) * N
            nn = nb * BN + tl.arange(0, BN)
            tl.store(dbq_ptr + bb + nn, tl.reshape(tl.join(tl.sum(gqe, 0), tl.sum(gqo, 0)), (BN,)))
            tl.store(dbk_ptr + bb + nn, tl.reshape(tl.join(tl.sum(gke, 0), tl.sum(gko, 0)), (BN,)))
        dq_e += gqe
        dq_o += gqo
        dk_e += gke
        dk_o += gko
    part = hsi * NB_B * T * sq_t  # 0 when HS == 1 (then dq/dk are the outputs themselves)
    store_pairs(dq_ptr + part, qrow, m, nb * BN, dq_e, dq_o, C, BN, STRIDED)
    store_pairs(dk_ptr + part, qrow, m, nb * BN, dk_e, dk_o, C, BN, STRIDED)
