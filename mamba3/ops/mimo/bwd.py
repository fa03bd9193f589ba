"""MIMO backward kernels.

Given dy (per-rank gradient of y, from ``mimo_out_kernel`` with BWD=True) the backward is:

- ``mimo_chunk_state_kernel`` MODE 1: dL_c = Σ_{i∈c} e^{c_i} dy_i q̃_iᵀ per state chunk (the gradient its
  outputs send to the chunk's incoming state);
- ``mimo_state_bwd_kernel``: reverse pass over the state chunks: dS_end[c] (gradient w.r.t. the state at the
  end of chunk c), the gradient of the input state, and e^{g[c]}⟨dS_end[c], S_in[c]⟩ (the gradient of the
  chunk's total log-decay through its incoming state);
- ``mimo_bwd_dqk_kernel`` (launched twice: dq̃, then dk̃) per (N-pair block, token tile, q/k group), looping
  over the heads of the group so dQ/dK are reduced in registers (no per-head copy in memory), then dθ, the
  bias partials, the inter-chunk term's log-decay partial Σ_r q̃·dq̃_inter and the rotation back to
  pre-rotation gradients;
- ``mimo_bwd_dv_kernel``: dṽ (→ dv, dψ partials), d scale, dγ and dD partials per (token tile, head), and the
  log-decay partials of the in-chunk pairs and of the chunk-state term.

With W_ij = e^{c_i − c_j}·scale_j (t_i > t_j), γ_i (t_i = t_j) and dP_ij = dy_i·ṽ_j:
    dq̃_i = e^{c_i} S_bᵀ dy_i + Σ_j (W ∘ dP)_ij k̃_j
    dk̃_j = e^{c_end − c_j} scale_j dS_endᵀ ṽ_j + Σ_i (W ∘ dP)_ij q̃_i
    dṽ_j = e^{c_end − c_j} scale_j dS_end k̃_j + Σ_i (W ∘ A)_ij dy_i + D dy_j,   A_ij = q̃_i·k̃_j
The gradient of the in-chunk log-decay cumsum at token t, with G = dP ∘ A ∘ W over the strict pairs (t_i > t_j)
and T_j = e^{c_end − c_j}·scale_j·ṽ_j·dS_end k̃_j (summed over ranks):
    dc_t = Σ_r q̃_t·dq̃_inter,t + Σ_j G_tj − Σ_i G_it − T_t                        (t not the chunk's last token)
    dc_end = the same, without T_end, + Σ_{j ≠ end} T_j + e^{c_end}⟨dS_end, S_in⟩
It equals Σ_r (q̃·dq̃ − k̃·dk̃) + ⟨dS_end, S_end⟩ at the end, but that form subtracts the same-token γ terms and the
last token's own T_end (neither depends on c) from themselves: an fp32 residue that dominates the decayed true
value under strong decay (adt = −12 per token: d_adt 1e-3 to 8e-3 relative; now < 1e-6).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.tiles import fast_exp
from .fwd import add_local_state
from .tiles import (bcast_pairs, dot_operand, later_mask, load_pair_block, load_rank_p, load_rows_p, load_state_pair,
                    mdot, mdot_split, pair_block_ptrs, pair_weights, qk_pointers, rot_pair, rows_of, state_block_ids,
                    store_state_pair, token_decays, token_strides, token_tile, token_weights, vtilde)


@triton.jit(do_not_specialize=["NBC"])
def mimo_state_bwd_kernel(BUF, OUT, SIN, DSFIN, DS0, DCEND, G, SEQ_BC, H, PN, NBC,
                          HAS_DSFIN: tl.constexpr, BLK: tl.constexpr):
    """Per (sequence, head), state chunks in reverse: OUT[c] ← dS_end[c] (rounded to OUT's dtype; OUT may be BUF)
    from BUF[c] = dL_c; dS ← e^{g[c]}·dS + dL_c (G (state chunks, H): each chunk's total log-decay). DCEND[blk, h, c]
    = partial e^{g[c]}·⟨dS_end[c], S_in[c]⟩, the gradient of g[c] through the incoming state (its part through the
    chunk's own ΔS comes from the dv kernel, per key token; S_in from SIN, fp32 or its bf16 copy). grid: (P·N
    blocks, NS, H).

    The previous chunk's dL, incoming state and decay are loaded one step ahead, before this step's store (they
    never alias it), so each step waits on one memory round trip less (as ``common.state_passing`` does)."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    h = tl.program_id(2)
    e = pid * BLK + tl.arange(0, BLK)
    m = e < PN
    fin = (s * H + h).to(tl.int64) * PN + e
    if HAS_DSFIN:
        ds = tl.load(DSFIN + fin, mask=m, other=0.0)
    else:
        ds = tl.zeros((BLK,), dtype=tl.float32)
    c_lo = tl.load(SEQ_BC + s)
    c_hi = tl.load(SEQ_BC + s + 1)
    last = c_hi - 1
    has_last = last >= c_lo
    off_last = (last * H + h).to(tl.int64) * PN + e
    d_next = tl.load(BUF + off_last, mask=m & has_last, other=0.0)
    s_in_next = tl.load(SIN + off_last, mask=m & has_last, other=0.0).to(tl.float32)
    g_next = tl.load(G + last * H + h, mask=has_last, other=0.0)
    for i in range(0, c_hi - c_lo):
        bc = c_hi - 1 - i
        off = (bc * H + h).to(tl.int64) * PN + e
        d = d_next
        s_in = s_in_next
        g = g_next
        prev = bc - 1
        has_prev = prev >= c_lo
        d_next = tl.load(BUF + off - H * PN, mask=m & has_prev, other=0.0)
        s_in_next = tl.load(SIN + off - H * PN, mask=m & has_prev, other=0.0).to(tl.float32)
        g_next = tl.load(G + prev * H + h, mask=has_prev, other=0.0)
        tl.store(OUT + off, ds.to(OUT.dtype.element_ty), mask=m)
        decay = fast_exp(g)
        tl.store(DCEND + (pid * H + h) * NBC + bc, decay * tl.sum(ds * s_in, axis=0))
        ds = decay * ds + d
    tl.store(DS0 + fin, ds, mask=m)


@triton.jit(do_not_specialize=["TT", "MAX_BC", "NBC"])
def mimo_state_scan_bwd_kernel(DY, Q, QB, ROT, CS, SIN, DSFIN, DSEND, DS0, DCEND, SEQ_TABLE, BC_START, BC_END,
                               MAX_BC, NBC, TT, H, HG, G, N2, A, P,
                               R: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr, BK: tl.constexpr,
                               HAS_DSFIN: tl.constexpr, DOT_PREC: tl.constexpr):
    """The reverse state pass with each chunk's local dS formed on the way (``MimoConfig.scan_dstates``): per
    (P block × N-pair block, sequence, head), state chunks from the last: DSEND[c] ← dS (the gradient at the chunk's
    end), DCEND[blk, h, c] ← e^{g[c]}·⟨dS, S_in[c]⟩ (this block's part), dS ← e^{g[c]}·dS + Σ_i e^{c_i} dy_i q̃_iᵀ
    (``add_local_state`` MODE 1, accumulated into dS); DS0[s] ← dS at the sequence's start. What the chunk-state
    kernel (MODE 1) and ``mimo_state_bwd_kernel`` give, without the local dS in DRAM. Idle iterations (sequences
    with fewer chunks than MAX_BC) store nothing and leave dS as is."""
    pid, s, h, g, p0, k0 = state_block_ids(HG, N2, BP, BK)
    PV = P - p0
    PN = P * (2 * N2)
    first = tl.load(SEQ_TABLE + 2 * s)
    nbc = tl.load(SEQ_TABLE + 2 * s + 1)
    fin = (s * H + h).to(tl.int64) * PN + p0 * (2 * N2)
    if HAS_DSFIN:
        d1, d2 = load_state_pair(DSFIN + fin, k0, N2, PV, BP, BK)  # [BP, BK] x2
    else:
        d1 = tl.zeros((BP, BK), dtype=tl.float32)
        d2 = tl.zeros((BP, BK), dtype=tl.float32)
    sq_t, sq_r, _sv_t, _, srot_t = token_strides(R, G, N2, H, P, A)
    for j in range(MAX_BC):
        live = j < nbc
        bc = tl.where(live, first + nbc - 1 - j, 0)
        tb = tl.load(BC_START + bc)
        te = tl.where(live, tl.load(BC_END + bc), tb)
        pv = tl.where(live, PV, 0)
        off = (bc * H + h).to(tl.int64) * PN + p0 * (2 * N2)
        store_state_pair(DSEND + off, d1, d2, k0, N2, pv, BP, BK)
        s1, s2 = load_state_pair(SIN + off, k0, N2, pv, BP, BK)
        decay = fast_exp(tl.where(live, tl.load(CS + h * TT + tl.maximum(te - 1, 0)), 0.0))
        tl.store(DCEND + (pid * H + h).to(tl.int64) * NBC + bc, decay * tl.sum(tl.sum(d1 * s1 + d2 * s2, 1), 0),
                 mask=live)
        d1, d2 = add_local_state(d1 * decay, d2 * decay, DY, R * H * P, H * P, CS, Q, sq_t, sq_r, QB, ROT, srot_t,
                                 CS + h * TT, CS + h * TT, tb, te, 0.0, g, h, p0, k0, N2, A, P, R, BM, BP, BK, 1,
                                 DOT_PREC)
    store_state_pair(DS0 + fin, d1, d2, k0, N2, PV, BP, BK)


@triton.jit(do_not_specialize=["TT", "NSL"])
def mimo_bwd_dqk_kernel(Q, K, V, ROT, CS, GAM, SCL, QB, KB, PSI, DY, SIN, DSEND, DPW,
                        DX, DTH, DCP, DXBP,
                        SC_START, SC_END, SC_BC, BC_START, BC_END, TT, H, HG, G, N2, A, P, NSL,
                        R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BP: tl.constexpr,
                        IS_K: tl.constexpr, DOT_PREC: tl.constexpr, LOAD_DPW: tl.constexpr = False):
    """dq̃ (IS_K=False) or dk̃ (IS_K=True) of one (N-pair block, token tile, q/k group); grid (nkb, tiles, G).

    Loops over the heads of the group and reduces dQ / dK in registers. Also writes, per head, the angle
    gradient (the q part first; the k launch adds its part to it), the bias partial of the tile and (q launch) the
    log-decay partial of the inter-chunk term, Σ_r q̃·dq̃_inter. DOT_PREC "bf16"/"fp16" (16-bit inputs,
    ``MimoConfig.bwd_dots16``): dy, ṽ, the states and the weighted dP enter the dots rounded to 16 bits, the
    rotated q̃ / k̃ as hi + lo halves. LOAD_DPW (``MimoConfig.bwd_store_dpw``): the weighted dP blocks are loaded
    from DPW, where the dv kernel stored them, instead of formed from dy and ṽ."""
    CT: tl.constexpr = BM // R
    kb = tl.program_id(0)
    sc = tl.program_id(1)
    g = tl.program_id(2)
    k0 = kb * BK
    tok0, tok1, bc = token_tile(SC_START, SC_END, SC_BC, sc)
    tb = tl.load(BC_START + bc)
    te = tl.load(BC_END + bc)
    sq_t, sq_r, sv_t, sy_t, srot_t = token_strides(R, G, N2, H, P, A)
    Qg = Q + g * 2 * N2
    Kg = K + g * 2 * N2
    PN = P * 2 * N2

    t, r, valid = rows_of(tok1 - tok0, R, BM)
    ti = tok0 + t
    kk = k0 + tl.arange(0, BK)
    km = kk < N2
    tt = tl.arange(0, CT)
    tv = tt < tok1 - tok0
    dX1 = tl.zeros((BM, BK), dtype=tl.float32)  # [BM, BK]
    dX2 = tl.zeros((BM, BK), dtype=tl.float32)
    for hh in range(0, HG):
        h = g * HG + hh
        QBh = QB + h * R * 2 * N2
        KBh = KB + h * R * 2 * N2
        ROTh = ROT + h * 2 * A
        Vh = V + h * P
        PSIh = PSI + h * R * P
        DYh = DY + h * P
        ci = tl.load(CS + h * TT + ti, mask=valid, other=0.0)
        if not IS_K:
            # dq̃_i = e^{c_i} S_bᵀ dy_i + Σ_{j ≤ i} (W ∘ dP)_ij k̃_j
            if not LOAD_DPW:
                dy_i = dot_operand(load_rows_p(DYh, sy_t, sv_t, ti, r, valid, P, BP), DOT_PREC)  # [BM, BP]
            dx1 = tl.zeros((BM, BK), dtype=tl.float32)
            dx2 = tl.zeros((BM, BK), dtype=tl.float32)
            for kt0 in range(tb, tok1, CT):
                if LOAD_DPW:  # the block the key tile kt0 (back tiles before this one) stored for this query tile
                    back = (tok0 - kt0) // CT
                    dpw = load_pair_block(DPW, sc - back, h, back, H, NSL, BM, DOT_PREC, True)
                else:
                    vt_j = vtilde(Vh, sv_t, PSIh, P, kt0, tok1 - kt0, P, R, BM, BP)
                    dp = mdot(dy_i, tl.trans(vt_j), None, DOT_PREC)  # [BM, BM]
                    dpw = dp * pair_weights(CS + h * TT, SCL + h * TT, GAM + h * TT, tok0, tok1 - tok0, kt0,
                                            tok1 - kt0, R, BM, False)
                k1j, k2j, _c, _s = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, kt0, tok1 - kt0, k0, N2, A, R, BM, BK)
                dx1 = mdot_split(dpw, k1j, dx1, DOT_PREC)
                dx2 = mdot_split(dpw, k2j, dx2, DOT_PREC)
            x1, x2, cs_, sn_ = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, tok0, tok1 - tok0, k0, N2, A, R, BM, BK)
            if LOAD_DPW:  # only now: fewer live tiles in the loop
                dy_i = dot_operand(load_rows_p(DYh, sy_t, sv_t, ti, r, valid, P, BP), DOT_PREC)
            # the inter-chunk term last, so that its log-decay partial q̃·dq̃_inter is formed alone: the in-chunk pairs'
            # part comes from the dv kernel, from the strict pairs only (through q̃·dq̃ − k̃·dk̃ the same-token γ terms
            # cancel, leaving an fp32 residue that dominates once the pairs decay: adt = −12, d_adt 1e-3 to 8e-3)
            s1, s2 = load_state_pair(SIN + (bc * H + h).to(tl.int64) * PN, k0, N2, P, BP, BK)  # [BP, BK]
            ei = fast_exp(ci)[:, None]
            ds = mdot(dy_i, s1, None, DOT_PREC) * ei  # one half at a time: fewer live [BM, BK] tiles
            dc = tl.sum(x1 * ds, axis=1)  # [BM]
            dx1 += ds
            ds = mdot(dy_i, s2, None, DOT_PREC) * ei
            dc += tl.sum(x2 * ds, axis=1)
            dx2 += ds
            dc = tl.sum(tl.reshape(dc, (CT, R)), axis=1)  # [CT]
            tl.store(DCP + (kb * H + h).to(tl.int64) * TT + tok0 + tt, dc, mask=tv)
        else:
            # dk̃_j = e^{c_end − c_j} scale_j dS_endᵀ ṽ_j + Σ_{i ≥ j} (W ∘ dP)_ij q̃_i (log-decay partials: dv kernel)
            sci = tl.load(SCL + h * TT + ti, mask=valid, other=0.0)
            c_end = tl.load(CS + h * TT + te - 1)
            vt_i = dot_operand(vtilde(Vh, sv_t, PSIh, P, tok0, tok1 - tok0, P, R, BM, BP), DOT_PREC)
            d1, d2 = load_state_pair(DSEND + (bc * H + h).to(tl.int64) * PN, k0, N2, P, BP, BK)
            wst = (fast_exp(c_end - ci) * sci)[:, None]
            dx1 = mdot(vt_i, d1, None, DOT_PREC) * wst
            dx2 = mdot(vt_i, d2, None, DOT_PREC) * wst
            for qt0 in range(tok0, te, CT):
                if LOAD_DPW:
                    dpw = load_pair_block(DPW, sc, h, (qt0 - tok0) // CT, H, NSL, BM, DOT_PREC)
                else:
                    tq_, rq, vq = rows_of(te - qt0, R, BM)
                    dy_q = load_rows_p(DYh, sy_t, sv_t, qt0 + tq_, rq, vq, P, BP)
                    dpt = mdot(vt_i, tl.trans(dy_q), None, DOT_PREC)  # [BM (own keys), BM (queries)]
                    dpw = dpt * pair_weights(CS + h * TT, SCL + h * TT, GAM + h * TT, tok0, tok1 - tok0, qt0,
                                             te - qt0, R, BM, True)
                q1q, q2q, _c, _s = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, qt0, te - qt0, k0, N2, A, R, BM, BK)
                dx1 = mdot_split(dpw, q1q, dx1, DOT_PREC)
                dx2 = mdot_split(dpw, q2q, dx2, DOT_PREC)
            x1, x2, cs_, sn_ = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, tok0, tok1 - tok0, k0, N2, A, R, BM, BK)

        # angle gradient, back to pre-rotation
        dth = tl.sum(tl.reshape(x1 * dx2 - x2 * dx1, (CT, R, BK)), axis=1)  # [CT, BK]
        mth = tv[:, None] & (kk < A)[None, :]
        offth = ((tok0 + tt).to(tl.int64)[:, None] * H + h) * A + kk[None, :]
        if IS_K:
            dth += tl.load(DTH + offth, mask=mth, other=0.0)
        tl.store(DTH + offth, dth, mask=mth)
        dxp1 = dx1 * cs_ + dx2 * sn_
        dxp2 = dx2 * cs_ - dx1 * sn_
        dX1 += dxp1
        dX2 += dxp2
        ro = tl.arange(0, R)
        offb = ((sc * H + h) * R + ro[:, None]).to(tl.int64) * (2 * N2) + kk[None, :]
        tl.store(DXBP + offb, tl.sum(tl.reshape(dxp1, (CT, R, BK)), axis=0), mask=km[None, :])
        tl.store(DXBP + offb + N2, tl.sum(tl.reshape(dxp2, (CT, R, BK)), axis=0), mask=km[None, :])

    m = valid[:, None] & km[None, :]
    off = ti.to(tl.int64)[:, None] * sq_t + r[:, None] * sq_r + g * 2 * N2 + kk[None, :]
    tl.store(DX + off, dX1.to(DX.dtype.element_ty), mask=m)
    tl.store(DX + off + N2, dX2.to(DX.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["TT", "NSL"])
def mimo_bwd_dv_kernel(Q, K, V, ROT, CS, GAM, SCL, QB, KB, PSI, DD, DY, DSEND,
                       DV, DPSIP, DDP, DSCL, DGAM, DCV, DPW,
                       SC_START, SC_END, SC_BC, BC_START, BC_END, TT, H, HG, G, N2, A, P, NSL,
                       R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BP: tl.constexpr,
                       HAS_D: tl.constexpr, ONE_K: tl.constexpr, DOT_PREC: tl.constexpr,
                       STORE_DPW: tl.constexpr = False):
    """grid: (token tiles, H). The tile's rows are the keys j. DOT_PREC "bf16"/"fp16" (16-bit inputs,
    ``MimoConfig.bwd_dots16``): every dot takes 16-bit operands (k̃, q̃, ṽ, dy, dS_end and the weighted scores).

    Also the log-decay gradient's parts that this tile's keys see, each entry written once: the in-chunk pairs'
    part from the strict pairs only (G = dP ∘ A ∘ W), as row sums for the query tokens, DCV[s, h, t] for the key
    tile s tiles before the query's (NSL slots); minus its column sums and the state term −e^{c_end − c_j}·scale_j·
    ṽ_j·dS_end k̃_j for this tile's key tokens, DCV[NSL, h, t]; and the state terms' opposite for the chunk's total
    decay, DCV[NSL + 1 + s, h, chunk's last token] for the tile s-th in its chunk. The last token's own state term
    does not depend on c (e^0) and appears in neither: the two would cancel, leaving an fp32 residue.
    STORE_DPW (``MimoConfig.bwd_store_dpw``): the weighted dP block of each query tile s tiles after this key tile,
    [BM keys, BM queries], goes to DPW[tile, h, s] for the dq / dk kernels, in DPW's dtype (``launch.dpw_dtype``: the
    dq / dk kernels' 16-bit operand dtype where their dots take 16-bit operands, bf16 with ``dpw16``, else fp32)."""
    CT: tl.constexpr = BM // R
    sc = tl.program_id(0)
    h = tl.program_id(1)
    g = h // HG
    tok0, tok1, bc = token_tile(SC_START, SC_END, SC_BC, sc)
    te = tl.load(BC_END + bc)
    sq_t, sq_r, sv_t, sy_t, srot_t = token_strides(R, G, N2, H, P, A)
    Qg, Kg, QBh, KBh, ROTh = qk_pointers(Q, K, QB, KB, ROT, g, h, R, N2, A)
    DYh = DY + h * P
    PN = P * 2 * N2

    t, r, valid = rows_of(tok1 - tok0, R, BM)
    tj = tok0 + t
    vt = vtilde(V + h * P, sv_t, PSI + h * R * P, P, tok0, tok1 - tok0, P, R, BM, BP)
    vt16 = dot_operand(vt, DOT_PREC)
    cj = tl.load(CS + h * TT + tj, mask=valid, other=0.0)
    scj = tl.load(SCL + h * TT + tj, mask=valid, other=0.0)
    c_end = tl.load(CS + h * TT + te - 1)

    # state term: U = dS_end k̃_j
    u = tl.zeros((BM, BP), dtype=tl.float32)  # [BM, BP]
    DSb = DSEND + (bc * H + h).to(tl.int64) * PN
    k1, k2, _c, _s = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, tok0, tok1 - tok0, 0, N2, A, R, BM, BK)  # [BM, BK] x2
    k1 = dot_operand(k1, DOT_PREC)
    k2 = dot_operand(k2, DOT_PREC)
    if ONE_K:  # N/2 ≤ BK: the key tile is rotated once and reused by every product below
        d1, d2 = load_state_pair(DSb, 0, N2, P, BP, BK)
        u = mdot(k1, tl.trans(d1), u, DOT_PREC)
        u = mdot(k2, tl.trans(d2), u, DOT_PREC)
    else:
        for k0 in range(0, N2, BK):
            k1b, k2b, _c, _s = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, tok0, tok1 - tok0, k0, N2, A, R, BM, BK)
            d1, d2 = load_state_pair(DSb, k0, N2, P, BP, BK)
            u = mdot(k1b, tl.trans(d1), u, DOT_PREC)
            u = mdot(k2b, tl.trans(d2), u, DOT_PREC)
    wst = fast_exp(c_end - cj)
    dvt = u * (wst * scj)[:, None]
    dscl = wst * tl.sum(vt * u, axis=1)  # [BM]
    dstate = scj * dscl  # the state term's log-decay partial (per row)
    dgam = tl.zeros((BM,), dtype=tl.float32)
    dcol = tl.zeros((BM,), dtype=tl.float32)
    tt = tl.arange(0, CT)

    for qt0 in range(tok0, te, CT):
        tq_, rq, vq = rows_of(te - qt0, R, BM)
        tq = qt0 + tq_
        at = tl.zeros((BM, BM), dtype=tl.float32)  # [BM (keys), BM (queries)]
        if ONE_K:
            q1, q2, _c2, _s2 = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, qt0, te - qt0, 0, N2, A, R, BM, BK)
            at = mdot(k1, tl.trans(q1), at, DOT_PREC)
            at = mdot(k2, tl.trans(q2), at, DOT_PREC)
        else:
            for k0 in range(0, N2, BK):
                k1b, k2b, _c, _s = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, tok0, tok1 - tok0, k0, N2, A, R, BM, BK)
                q1, q2, _c2, _s2 = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, qt0, te - qt0, k0, N2, A, R, BM, BK)
                at = mdot(k1b, tl.trans(q1), at, DOT_PREC)
                at = mdot(k2b, tl.trans(q2), at, DOT_PREC)
        dy_q = dot_operand(load_rows_p(DYh, sy_t, sv_t, tq, rq, vq, P, BP), DOT_PREC)  # [BM, BP]
        dpt = mdot(vt16, tl.trans(dy_q), None, DOT_PREC)  # [BM, BM]
        # the token decays once for both the weights and the strict pairs' log-decay partials below
        e = token_decays(CS + h * TT, tok0, tok1 - tok0, qt0, te - qt0, CT)
        strict, same = later_mask(tok0, qt0, CT, True)
        wt = bcast_pairs(token_weights(e, strict, same, SCL + h * TT, GAM + h * TT, tok0, tok1 - tok0, qt0, te - qt0,
                                       CT, True), R, BM)
        dvt = mdot(at * wt, dy_q, dvt, DOT_PREC)
        if STORE_DPW:
            tl.store(pair_block_ptrs(DPW, sc, h, (qt0 - tok0) // CT, H, NSL, BM), (dpt * wt).to(DPW.dtype.element_ty))
        e_later = bcast_pairs(tl.where(strict, e, 0.0), R, BM)
        x = dpt * at
        xe = x * e_later
        dcol += tl.sum(xe, axis=1)
        dgam += tl.sum(tl.where(tq[None, :] == tj[:, None], x, 0.0), axis=1)
        drow = tl.sum(tl.reshape(tl.sum(xe * scj[:, None], axis=0), (CT, R)), axis=1)  # [CT] query tokens
        tl.store(DCV + (((qt0 - tok0) // CT) * H + h).to(tl.int64) * TT + qt0 + tt, drow, mask=tt < te - qt0)
    dscl += dcol

    if HAS_D:
        dy_j = load_rows_p(DYh, sy_t, sv_t, tj, r, valid, P, BP)
        dvt += tl.load(DD + h).to(tl.float32) * dy_j
        tl.store(DDP + sc * H + h, tl.sum(tl.sum(dy_j * vt, axis=1), axis=0))

    pp = tl.arange(0, BP)
    pm = pp < P
    tv = tt < tok1 - tok0
    dstate = tl.where(valid & (tj != te - 1), dstate, 0.0)  # the last token's own state term: neither side
    dck = -tl.sum(tl.reshape(scj * dcol + dstate, (CT, R)), axis=1)  # [CT] key tokens
    tl.store(DCV + (NSL * H + h).to(tl.int64) * TT + tok0 + tt, dck, mask=tv)
    slot = NSL + 1 + (tok0 - tl.load(BC_START + bc)) // CT
    # (one 2-D reduction: reducing the [BM] or [CT] sums to a scalar fails to compile for sm_100, Triton 3.6:
    # "parent layout must have at least rank >= 2" in its TMEM layout pass)
    tl.store(DCV + (slot * H + h).to(tl.int64) * TT + te - 1, tl.sum(tl.reshape(dstate, (CT, R))))
    psi = load_rank_p(PSI + h * R * P, r, valid, P, P, BP)
    v_raw = load_rows_p(V + h * P, sv_t, 0, tj, r, valid, P, BP)  # [BM, BP]
    dv = tl.sum(tl.reshape(dvt * psi, (CT, R, BP)), axis=1)  # [CT, BP]
    offv = (tok0 + tt).to(tl.int64)[:, None] * sv_t + h * P + pp[None, :]
    tl.store(DV + offv, dv.to(DV.dtype.element_ty), mask=tv[:, None] & pm[None, :])
    dpsi = tl.sum(tl.reshape(dvt * v_raw, (CT, R, BP)), axis=0)  # [R, BP]
    ro = tl.arange(0, R)
    tl.store(DPSIP + ((sc * H + h) * R + ro[:, None]).to(tl.int64) * P + pp[None, :], dpsi, mask=pm[None, :])
    tl.store(DSCL + h * TT + tok0 + tt, tl.sum(tl.reshape(dscl, (CT, R)), axis=1), mask=tv)
    tl.store(DGAM + h * TT + tok0 + tt, tl.sum(tl.reshape(dgam, (CT, R)), axis=1), mask=tv)
