"""MIMO forward kernels (also re-run by the backward to recompute states and outputs).

Chunk-parallel structure (see :mod:`.function` for the tables):

1. ``mimo_chunk_state_kernel`` (MODE 0): for every *state chunk* (CS tokens) and head, its local state
   ΔS = Σ_j e^{c_end − c_j}·scale_j·Σ_r ṽ_{j,r} k̃_{j,r}ᵀ (P×N, fp32), all chunks in parallel, tiled over
   (P, N-pair) blocks. The same kernel with MODE 1 computes the backward's Σ_i e^{c_i} dy_i q̃_iᵀ.
2. ``common.state_passing`` (shared with SISO): walks the state chunks of each (sequence, head) and replaces
   each ΔS by the state entering the chunk; input states enter here, final states leave here.
3. ``mimo_out_kernel``: every *token tile* (CT tokens = BM rows) in parallel: inter-chunk term from the
   incoming state + the quadratic form over the earlier tiles of its state chunk + D, then the RMSNorm / gate /
   rank contraction epilogue. With BWD=True it recomputes y and runs the epilogue backward instead (dy, dz and
   per-tile partial sums of dφ, dζ and the norm weight).

Shared memory is spent only on dot operands (nothing is software-pipelined): a [BM, BK] and [BK, BM] pair for
the scores, [BM, BM] × [BM, BP] for the value product and [BM, BK] × [BK, BP] for the state product, all fp32.
It depends on BM, BK and BP (P rounded up to a power of two), never on N, T or the batch.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.tiles import fast_exp, fast_sigmoid
from .tiles import (dot_operand, load_rank_p, load_rows_p, load_state_pair, load_tok_rows, mdot, pair_weights,
                    qk_pointers, rot_pair, rows_of, state_block_ids, store_rows_p, store_state_pair, token_strides,
                    token_tile, vtilde)


@triton.jit
def norm_gate(y, Zp, ZETAp, NWp, sv_t, tok0, ntok, r, valid, P, PV, eps, R: tl.constexpr, BM: tl.constexpr,
              BP: tl.constexpr, HAS_Z: tl.constexpr, NORM: tl.constexpr, HAS_NW: tl.constexpr,
              GATHER: tl.constexpr = False):
    """The output epilogue's RMSNorm over P (all of P in the tile) and gate of y [BM, BP]: (n, rstd, nw, zt, zz, σ,
    gate, o) with n the normed y and o = n ⊙ gate; the pieces the epilogue backward reuses, zeros where a feature
    is off. Zp / ZETAp / NWp point at column 0 of this tile's P block of z[·, h], ζ[h], w[h]; PV columns valid."""
    pp = tl.arange(0, BP)
    pm = pp < PV
    rstd = tl.zeros((BM,), dtype=tl.float32)
    nw = tl.zeros((BP,), dtype=tl.float32)
    if NORM:
        rstd = tl.rsqrt(tl.sum(y * y, axis=1) / P + eps)
        if HAS_NW:
            nw = tl.load(NWp + pp, mask=pm, other=0.0).to(tl.float32)
        else:
            nw = tl.where(pm, 1.0, 0.0)
        n = y * rstd[:, None] * nw[None, :]
    else:
        n = y
    zt = tl.zeros_like(y)
    zz = tl.zeros_like(y)
    sg = tl.zeros_like(y)
    gate = tl.zeros_like(y)
    if HAS_Z:
        zt = load_tok_rows(Zp, sv_t, tok0, ntok, PV, R, BM, BP, GATHER)
        zz = zt * load_rank_p(ZETAp, r, valid, P, PV, BP)
        sg = fast_sigmoid(zz)
        gate = zz * sg
        o = n * gate
    else:
        o = n
    return n, rstd, nw, zt, zz, sg, gate, o


@triton.jit
def store_out(o, OUTp, PHIp, sv_t, tok0, ntok, ti, r, valid, P, PV, R: tl.constexpr, BM: tl.constexpr,
              BP: tl.constexpr, HAS_OUT: tl.constexpr):
    """Stores the gated rows o [BM, BP]: contracted over the ranks with φ into (TT, H, P) (HAS_OUT), else per rank
    into (TT, R, H, P). OUTp / PHIp point at column 0 of this tile's P block of out[0, h] / φ[h]; PV columns valid."""
    CT: tl.constexpr = BM // R
    pp = tl.arange(0, BP)
    pm = pp < PV
    if HAS_OUT:
        o = o * load_rank_p(PHIp, r, valid, P, PV, BP)
        out = tl.sum(tl.reshape(o, (CT, R, BP)), axis=1)  # [CT, BP]
        tt = tl.arange(0, CT)
        off = (tok0 + tt).to(tl.int64)[:, None] * sv_t + pp[None, :]
        tl.store(OUTp + off, out.to(OUTp.dtype.element_ty), mask=(tt < ntok)[:, None] & pm[None, :])
    else:
        off = (ti.to(tl.int64)[:, None] * R + r[:, None]) * sv_t + pp[None, :]
        tl.store(OUTp + off, o.to(OUTp.dtype.element_ty), mask=valid[:, None] & pm[None, :])


@triton.jit
def out_backward(y, n, rstd, nw, zt, zz, sg, gate, o, DOUTp, PHIp, ZETAp, DYp, DZp, DPHIp, DZETAp, DNWp, sv_t, tok0,
                 ntok, ti, r, valid, P, PV, R: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr,
                 HAS_Z: tl.constexpr, HAS_OUT: tl.constexpr, NORM: tl.constexpr, HAS_NW: tl.constexpr):
    """The output epilogue's backward for the rows y [BM, BP] of one token tile, given :func:`norm_gate`'s pieces:
    dy into (TT, R, H, P) fp32 at DYp, dz at DZp, and the tile's partial sums of dφ [R, BP] at DPHIp, dζ [R, BP] at
    DZETAp (row stride P) and dw [BP] at DNWp. Every pointer at column 0 of the tile's P block (of head h, of the
    tile's partial row); PV columns valid (0: nothing is stored)."""
    CT: tl.constexpr = BM // R
    pp = tl.arange(0, BP)
    pm = pp < PV
    ro = tl.arange(0, R)
    if HAS_OUT:
        phi = load_rank_p(PHIp, r, valid, P, PV, BP)
        do_t = load_tok_rows(DOUTp, sv_t, tok0, ntok, PV, R, BM, BP)
        dphi = tl.sum(tl.reshape(o * do_t, (CT, R, BP)), axis=0)  # [R, BP]
        tl.store(DPHIp + ro[:, None] * P + pp[None, :], dphi, mask=pm[None, :])
        do = do_t * phi
    else:
        do = load_rows_p(DOUTp, R * sv_t, sv_t, ti, r, valid, PV, BP)
    if HAS_Z:
        dn = do * gate
        dzz = do * n * sg * (1.0 + zz * (1.0 - sg))
        zeta = load_rank_p(ZETAp, r, valid, P, PV, BP)
        dz = tl.sum(tl.reshape(dzz * zeta, (CT, R, BP)), axis=1)  # [CT, BP]
        tt = tl.arange(0, CT)
        offz = (tok0 + tt).to(tl.int64)[:, None] * sv_t + pp[None, :]
        tl.store(DZp + offz, dz.to(DZp.dtype.element_ty), mask=(tt < ntok)[:, None] & pm[None, :])
        dzeta = tl.sum(tl.reshape(dzz * zt, (CT, R, BP)), axis=0)  # [R, BP]
        tl.store(DZETAp + ro[:, None] * P + pp[None, :], dzeta, mask=pm[None, :])
    else:
        dn = do
    if NORM:  # all of P in the tile
        if HAS_NW:
            dnw = tl.sum(dn * y * rstd[:, None], axis=0)  # [BP]
            tl.store(DNWp + pp, dnw, mask=pm)
        u = dn * nw[None, :]
        dy = rstd[:, None] * (u - y * (rstd * rstd * tl.sum(u * y, axis=1) / P)[:, None])
    else:
        dy = dn
    offy = (ti.to(tl.int64)[:, None] * R + r[:, None]) * sv_t + pp[None, :]
    tl.store(DYp + offy, dy, mask=valid[:, None] & pm[None, :])


@triton.jit
def add_local_state(acc1, acc2, X, sx_t, sx_r, PSI, Y, sy_t, sy_r, BIAS, ROT, srot_t, CSh, SCLh, tb, te, c_end, g, h,
                    p0, k0, N2, A, P, R: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr, BK: tl.constexpr,
                    MODE: tl.constexpr, DOT_PREC: tl.constexpr):
    """(acc1, acc2) + Σ_{rows i of tokens [tb, te)} w_i·x_i y_iᵀ at P block p0 and N-pair block k0, as two [BP, BK]
    pair halves (CSh / SCLh at the head's rows of c and scale; c_end the chunk's last c, read in MODE 0 only).

    MODE 0: x = v ⊙ ψ_r (X = v, sx_r = 0), y = k̃, w = e^{c_end − c_i}·scale_i.
    MODE 1: x = dy (per-rank), y = q̃, w = e^{c_i}."""
    CT: tl.constexpr = BM // R
    for t0 in range(tb, te, CT):
        t, r, valid = rows_of(te - t0, R, BM)
        tok = t0 + t
        c = tl.load(CSh + tok, mask=valid, other=0.0)
        y1, y2, _c, _s = rot_pair(Y + g * 2 * N2, sy_t, sy_r, BIAS + h * R * 2 * N2, ROT + h * 2 * A, srot_t,
                                  t0, te - t0, k0, N2, A, R, BM, BK)  # [BM, BK] x2
        if MODE == 0:
            x = vtilde(X + h * P + p0, sx_t, PSI + h * R * P + p0, P, t0, te - t0, P - p0, R, BM, BP)  # [BM, BP]
            w = fast_exp(c_end - c) * tl.load(SCLh + tok, mask=valid, other=0.0)
        else:
            x = load_rows_p(X + h * P + p0, sx_t, sx_r, tok, r, valid, P - p0, BP)  # [BM, BP]
            w = fast_exp(c)
        xw = tl.trans(x * w[:, None])  # [BP, BM]
        acc1 = mdot(xw, y1, acc1, DOT_PREC)
        acc2 = mdot(xw, y2, acc2, DOT_PREC)
    return acc1, acc2


@triton.jit(do_not_specialize=["TT"])
def mimo_chunk_state_kernel(X, sx_t, sx_r, PSI, Y, sy_t, sy_r, BIAS, ROT, srot_t, CS, SCL, OUT,
                            BC_START, BC_END, TT, H, HG, G, N2, A, P,
                            R: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr, BK: tl.constexpr,
                            MODE: tl.constexpr, DOT_PREC: tl.constexpr):
    """OUT[c, h] (P, N) = Σ_{rows i of chunk c} w_i·x_i y_iᵀ (``add_local_state``'s MODE 0 / 1).
    grid: (P blocks × N-pair blocks, state chunks, H)."""
    _blk, bc, h, g, p0, k0 = state_block_ids(HG, N2, BP, BK)
    tb = tl.load(BC_START + bc)
    te = tl.load(BC_END + bc)
    c_end = tl.load(CS + h * TT + te - 1)
    acc1 = tl.zeros((BP, BK), dtype=tl.float32)  # [BP, BK]
    acc2 = tl.zeros((BP, BK), dtype=tl.float32)  # [BP, BK]
    acc1, acc2 = add_local_state(acc1, acc2, X, sx_t, sx_r, PSI, Y, sy_t, sy_r, BIAS, ROT, srot_t, CS + h * TT,
                                 SCL + h * TT, tb, te, c_end, g, h, p0, k0, N2, A, P, R, BM, BP, BK, MODE, DOT_PREC)
    store_state_pair(OUT + ((bc * H + h).to(tl.int64) * P + p0) * (2 * N2), acc1, acc2, k0, N2, P - p0, BP, BK)


@triton.jit(do_not_specialize=["TT"])
def mimo_out_kernel(Q, K, V, ROT, CS, GAM, SCL, QB, KB, PSI, ZETA, PHI, DD, Z, NW, SIN, OUT,
                    DOUT, DY, DZ, DPHIP, DZETAP, DNWP, YS,
                    SC_START, SC_END, SC_BC, BC_START, TT, H, HG, G, N2, A, P, eps,
                    R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BP: tl.constexpr,
                    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_OUT: tl.constexpr, NORM: tl.constexpr,
                    HAS_NW: tl.constexpr, BWD: tl.constexpr, ONE_K: tl.constexpr, DOT_PREC: tl.constexpr,
                    TOK_PREC: tl.constexpr, Y_IO: tl.constexpr = 0):
    """y for the BM rows of one token tile (grid: (token tiles, H)), then the output epilogue (BWD=False) or
    its backward (BWD=True: DOUT → DY (TT, R, H, P) fp32, DZ, and per-tile partials of dφ, dζ, dw).
    Y_IO (``MimoConfig.save_y``): 1, the forward also stores y at YS (TT, R, H, P; YS's dtype); 2, the backward loads y
    from there instead of computing it again."""
    CT: tl.constexpr = BM // R
    sc = tl.program_id(0)
    h = tl.program_id(1)
    g = h // HG
    tok0, tok1, bc = token_tile(SC_START, SC_END, SC_BC, sc)
    _sq_t, _sq_r, sv_t, sy_t, _srot_t = token_strides(R, G, N2, H, P, A)
    t, r, valid = rows_of(tok1 - tok0, R, BM)
    ti = tok0 + t
    if Y_IO == 2:
        y = load_rows_p(YS + h * P, sy_t, sv_t, ti, r, valid, P, BP)
    else:
        y = tile_output(Q, K, V, ROT, CS, GAM, SCL, QB, KB, PSI, DD, SIN, tok0, tok1, bc, tl.load(BC_START + bc), h,
                        g, TT, H, G, N2, A, P, R, BM, BK, BP, HAS_D, ONE_K, DOT_PREC, TOK_PREC)
        if Y_IO == 1:
            store_rows_p(YS + h * P, sy_t, sv_t, ti, r, valid, y, P)

    n, rstd, nw, zt, zz, sg, gate, o = norm_gate(y, Z + h * P, ZETA + h * R * P, NW + h * P, sv_t, tok0,
                                                 tok1 - tok0, r, valid, P, P, eps, R, BM, BP, HAS_Z, NORM, HAS_NW)
    if not BWD:
        store_out(o, OUT + h * P, PHI + h * R * P, sv_t, tok0, tok1 - tok0, ti, r, valid, P, P, R, BM, BP, HAS_OUT)
    else:
        out_backward(y, n, rstd, nw, zt, zz, sg, gate, o, DOUT + h * P, PHI + h * R * P, ZETA + h * R * P, DY + h * P,
                     DZ + h * P, DPHIP + (sc * H + h) * R * P, DZETAP + (sc * H + h) * R * P, DNWP + (sc * H + h) * P,
                     sv_t, tok0, tok1 - tok0, ti, r, valid, P, P, R, BM, BP, HAS_Z, HAS_OUT, NORM, HAS_NW)


@triton.jit
def tile_output(Q, K, V, ROT, CS, GAM, SCL, QB, KB, PSI, DD, SIN, tok0, tok1, bc, tb, h, g, TT, H, G, N2, A, P,
                R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BP: tl.constexpr, HAS_D: tl.constexpr,
                ONE_K: tl.constexpr, DOT_PREC: tl.constexpr, TOK_PREC: tl.constexpr):
    """y [BM, BP] of the rows of tokens [tok0, tok1) of head h in state chunk bc (whose first token is tb), from
    the state entering the chunk (SIN) and the chunk's earlier tiles."""
    CT: tl.constexpr = BM // R
    sq_t, sq_r, sv_t, _, srot_t = token_strides(R, G, N2, H, P, A)
    Qg, Kg, QBh, KBh, ROTh = qk_pointers(Q, K, QB, KB, ROT, g, h, R, N2, A)
    Vh = V + h * P
    PSIh = PSI + h * R * P
    t, r, valid = rows_of(tok1 - tok0, R, BM)
    ti = tok0 + t
    ci = tl.load(CS + h * TT + ti, mask=valid, other=0.0)

    # inter-chunk: e^{c_i}·S q̃_i
    acc = tl.zeros((BM, BP), dtype=tl.float32)  # [BM, BP]
    Sb = SIN + (bc * H + h).to(tl.int64) * P * (2 * N2)
    q1, q2, _c, _s = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, tok0, tok1 - tok0, 0, N2, A, R, BM, BK)  # [BM, BK] x2
    if ONE_K:  # N/2 ≤ BK: the query tile is rotated once and reused by every product below
        s1, s2 = load_state_pair(Sb, 0, N2, P, BP, BK)
        acc = mdot(q1, tl.trans(s1), acc, DOT_PREC)
        acc = mdot(q2, tl.trans(s2), acc, DOT_PREC)
    else:
        for k0 in range(0, N2, BK):
            q1, q2, _c, _s = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, tok0, tok1 - tok0, k0, N2, A, R, BM, BK)
            s1, s2 = load_state_pair(Sb, k0, N2, P, BP, BK)
            acc = mdot(q1, tl.trans(s1), acc, DOT_PREC)
            acc = mdot(q2, tl.trans(s2), acc, DOT_PREC)
    acc = acc * fast_exp(ci)[:, None]

    # intra-chunk: earlier tiles of the state chunk and this one
    for kt0 in range(tb, tok1, CT):
        s_ij = tl.zeros((BM, BM), dtype=tl.float32)  # [BM, BM]
        if ONE_K:
            k1, k2, _c2, _s2 = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, kt0, tok1 - kt0, 0, N2, A, R, BM, BK)
            s_ij = mdot(q1, tl.trans(k1), s_ij, TOK_PREC)
            s_ij = mdot(q2, tl.trans(k2), s_ij, TOK_PREC)
        else:
            for k0 in range(0, N2, BK):
                q1, q2, _c, _s = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, tok0, tok1 - tok0, k0, N2, A, R, BM, BK)
                k1, k2, _c2, _s2 = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, kt0, tok1 - kt0, k0, N2, A, R, BM, BK)
                s_ij = mdot(q1, tl.trans(k1), s_ij, TOK_PREC)
                s_ij = mdot(q2, tl.trans(k2), s_ij, TOK_PREC)
        w = pair_weights(CS + h * TT, SCL + h * TT, GAM + h * TT, tok0, tok1 - tok0, kt0, tok1 - kt0, R, BM, False)
        vt = vtilde(Vh, sv_t, PSIh, P, kt0, tok1 - kt0, P, R, BM, BP)
        acc = mdot(s_ij * w, vt, acc, TOK_PREC)

    if HAS_D:
        acc += tl.load(DD + h).to(tl.float32) * vtilde(Vh, sv_t, PSIh, P, tok0, tok1 - tok0, P, R, BM, BP)
    return acc


@triton.jit(do_not_specialize=["TT", "MAX_BC"])
def mimo_scan_out_kernel(Q, K, V, ROT, CS, GAM, SCL, QB, KB, PSI, ZETA, PHI, DD, Z, NW, S0, OUT, SFIN, SIN, YS,
                         SEQ_TABLE, BC_START, BC_END, MAX_BC, TT, H, HG, G, N2, A, P, eps,
                         R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BP: tl.constexpr,
                         HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_OUT: tl.constexpr, NORM: tl.constexpr,
                         HAS_NW: tl.constexpr, HAS_S0: tl.constexpr, DOT_PREC: tl.constexpr,
                         TOK_PREC: tl.constexpr, STATES: tl.constexpr = False, GATHER: tl.constexpr = False,
                         SAVE_Y: tl.constexpr = False):
    """The whole forward of one (sequence, head, P block) in one walk over the sequence's state chunks, each one
    token tile (grid: (P blocks, sequences, H); ``MimoConfig.scan_fwd``). The state S (P block × N, fp32, as its two
    [BP, BK] pair halves) stays in registers: per chunk, y_i = e^{c_i}·S q̃_i + Σ_{j ≤ i} W_ij (q̃_i·k̃_j) ṽ_j + D ṽ_i,
    the output epilogue, then S ← e^{c_end}·S + Σ_j e^{c_end − c_j}·scale_j·ṽ_j k̃_jᵀ — the chunk-state, state-passing
    and output kernels' arithmetic at their precisions, without the states in DRAM. S starts from S0 (or zero);
    the final state goes to SFIN (NS, H, P, N). Needs N/2 ≤ BK. A sequence with fewer state chunks than MAX_BC
    idles through the rest (a loop bound loaded from memory runs compiled but not in the interpreter).

    STATES (the backward's recompute, ``MimoConfig.scan_states``): no outputs and no final state; the state entering
    each state chunk goes to SIN (state chunks, H, P, N), as the chunk-state kernel and the state pass give it. With
    SAVE_Y too (``MimoConfig.bwd_walk_y``) the walk also forms y as the forward did and stores it at YS for the
    output kernel's backward.
    GATHER (``MimoConfig.scan_gather``): the per-token and per-rank operands loaded per row (:func:`rot_pair`).
    SAVE_Y (``MimoConfig.save_y``): y before the epilogue also goes to YS (TT, R, H, P; YS's dtype), for the backward.
    (Running the output epilogue's backward in that walk as well, in place of the output kernel's backward pass, was
    timed on the H200 in the twenty-seventh session: 34.5 against 30.7 ms forward+backward at B8 T4096; removed.)"""
    pb = tl.program_id(0)
    s = tl.program_id(1)
    h = tl.program_id(2)
    g = h // HG
    p0 = pb * BP
    PV = P - p0  # valid columns of this P block
    sq_t, sq_r, sv_t, sy_t, srot_t = token_strides(R, G, N2, H, P, A)
    Qg, Kg, QBh, KBh, ROTh = qk_pointers(Q, K, QB, KB, ROT, g, h, R, N2, A)
    CSh = CS + h * TT
    SCLh = SCL + h * TT
    first = tl.load(SEQ_TABLE + 2 * s)
    nbc = tl.load(SEQ_TABLE + 2 * s + 1)
    s_off = (s * H + h).to(tl.int64) * P * (2 * N2) + p0 * (2 * N2)
    if HAS_S0:
        s1, s2 = load_state_pair(S0 + s_off, 0, N2, PV, BP, BK)  # [BP, BK] x2
    else:
        s1 = tl.zeros((BP, BK), dtype=tl.float32)
        s2 = tl.zeros((BP, BK), dtype=tl.float32)
    for j in range(MAX_BC):
        live = j < nbc
        bc = tl.where(live, first + j, 0)
        tok0 = tl.load(BC_START + bc)
        ntok = tl.where(live, tl.load(BC_END + bc) - tok0, 0)
        t, r, valid = rows_of(ntok, R, BM)
        ti = tok0 + t
        ci = tl.load(CSh + ti, mask=valid, other=0.0)
        if not STATES or SAVE_Y:
            # inter-chunk: e^{c_i}·S q̃_i (the state as the chunked path's output kernel takes it: fp32 at DOT_PREC);
            # q̃ and k̃ are then held as the in-chunk dots take them (16-bit for 16-bit TOK_PREC: half the registers)
            q1, q2, _c, _s = rot_pair(Qg, sq_t, sq_r, QBh, ROTh, srot_t, tok0, ntok, 0, N2, A, R, BM, BK, GATHER)
            acc = tl.zeros((BM, BP), dtype=tl.float32)
            acc = mdot(q1, tl.trans(s1), acc, DOT_PREC)
            acc = mdot(q2, tl.trans(s2), acc, DOT_PREC)
            acc = acc * fast_exp(ci)[:, None]
            q1 = dot_operand(q1, TOK_PREC)
            q2 = dot_operand(q2, TOK_PREC)
        k1, k2, _c2, _s2 = rot_pair(Kg, sq_t, sq_r, KBh, ROTh, srot_t, tok0, ntok, 0, N2, A, R, BM, BK, GATHER)
        k1 = dot_operand(k1, TOK_PREC)
        k2 = dot_operand(k2, TOK_PREC)
        if not STATES or SAVE_Y:  # in-chunk
            s_ij = tl.zeros((BM, BM), dtype=tl.float32)
            s_ij = mdot(q1, tl.trans(k1), s_ij, TOK_PREC)
            s_ij = mdot(q2, tl.trans(k2), s_ij, TOK_PREC)
        vt = vtilde(V + h * P + p0, sv_t, PSI + h * R * P + p0, P, tok0, ntok, PV, R, BM, BP, GATHER)  # [BM, BP]
        if STATES:  # the state entering chunk bc (none from an idle iteration)
            store_state_pair(SIN + (bc * H + h).to(tl.int64) * P * (2 * N2) + p0 * (2 * N2), s1, s2, 0, N2,
                             tl.where(live, PV, 0), BP, BK)
        if not STATES or SAVE_Y:
            w = pair_weights(CSh, SCLh, GAM + h * TT, tok0, ntok, tok0, ntok, R, BM, False)
            acc = mdot(s_ij * w, vt, acc, TOK_PREC)
            if HAS_D:
                acc += tl.load(DD + h).to(tl.float32) * vt
            if SAVE_Y:
                store_rows_p(YS + h * P + p0, sy_t, sv_t, ti, r, valid, acc, PV)
        if not STATES:
            _n, _rstd, _nw, _zt, _zz, _sg, _gate, o = norm_gate(acc, Z + h * P + p0, ZETA + h * R * P + p0,
                                                                NW + h * P + p0, sv_t, tok0, ntok, r, valid, P, PV,
                                                                eps, R, BM, BP, HAS_Z, NORM, HAS_NW, GATHER)
            store_out(o, OUT + h * P + p0, PHI + h * R * P + p0, sv_t, tok0, ntok, ti, r, valid, P, PV, R, BM, BP,
                      HAS_OUT)
        # the state leaving the chunk (a dead iteration: no rows, c_end = 0, S unchanged)
        c_end = tl.load(CSh + tl.maximum(tok0 + ntok - 1, 0))
        c_end = tl.where(live, c_end, 0.0)
        wk = fast_exp(c_end - ci) * tl.load(SCLh + ti, mask=valid, other=0.0)  # [BM]
        xw = tl.trans(vt * wk[:, None])  # [BP, BM]
        decay = fast_exp(c_end)
        s1 = mdot(xw, k1, s1 * decay, TOK_PREC)
        s2 = mdot(xw, k2, s2 * decay, TOK_PREC)
    if not STATES:
        store_state_pair(SFIN + s_off, s1, s2, 0, N2, PV, BP, BK)
