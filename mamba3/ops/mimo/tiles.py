"""Tile helpers shared by the MIMO forward and backward kernels.

Layout conventions (set up by :mod:`.function`; every tensor is contiguous):
- tokens are flattened over the batch: token index ``tok`` in [0, TT), TT = B·T (or the packed length);
- a *row* of a tile is a (token, rank) pair: row i of a tile that starts at token ``tok0`` is token
  ``tok0 + i // R``, rank ``i % R`` (BM = CT·R rows for CT tokens);
- q, k: (TT, R, G, N); v, z: (TT, H, P); rotation planes: (TT, H, 2, A) fp32 (sin θ, then cos θ); per-rank
  dy: (TT, R, H, P) fp32;
  cs / γ / scale: (H, TT) fp32; states: (num_chunks, H, P, N) fp32;
- N is processed as half-split pairs: a "pair block" holds columns [k0, k0+BK) and [N/2 + k0, N/2 + k0 + BK)
  of q/k, which is exactly what a rotation by θ[:, k0:k0+BK] mixes. Columns n ≥ A are not rotated (θ = 0).

All arithmetic is fp32; inputs are widened on load, and dots go through ``mdot`` (fp32 operands as tf32 / tf32x3,
or rounded to 16 bits where the launcher asks for it). Masked rows / columns load as exact zeros, so padded
rows contribute nothing to any dot.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.tiles import fast_exp, split16


@triton.jit
def mdot(a, b, acc, PREC: tl.constexpr):
    """a @ b (+ acc), accumulated in fp32. PREC "bf16" / "fp16" (16-bit inputs): the fp32 operands are rounded to
    the input's 16-bit type (one bf16/fp16 MMA, as the SISO kernels' 16-bit path); "tf32x3" / "tf32" / "ieee":
    fp32 operands at that input precision."""
    if PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    elif PREC == "fp16":
        return tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def dot_operand(x, PREC: tl.constexpr):
    """x as ``mdot`` will feed it to the tensor cores: rounded to 16 bits once for PREC "bf16" / "fp16" (so a tile
    used by several dots is held at half the registers), unchanged otherwise."""
    if PREC == "bf16":
        return x.to(tl.bfloat16)
    elif PREC == "fp16":
        return x.to(tl.float16)
    else:
        return x


@triton.jit
def mdot_split(a, b, acc, PREC: tl.constexpr):
    """a @ b (+ acc) where b is a rotated q̃ or k̃ tile (fp32): for 16-bit PREC, b enters as hi + lo 16-bit halves
    (two MMAs; ~16 mantissa bits), because the angle gradient x̃1·dx̃2 − x̃2·dx̃1 cancels and one bf16 rounding of
    b puts it at the 1e-2 bar (as SISO's ``exact_dot``); otherwise one dot at PREC."""
    if PREC == "bf16" or PREC == "fp16":
        a16 = dot_operand(a, PREC)
        hi, lo = split16(b, a16.dtype)
        return tl.dot(a16, lo, tl.dot(a16, hi, acc))
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def token_tile(SC_START, SC_END, SC_BC, sc):
    """(first token, end token, state chunk) of token tile ``sc``."""
    return tl.load(SC_START + sc), tl.load(SC_END + sc), tl.load(SC_BC + sc)


@triton.jit
def token_strides(R: tl.constexpr, G, N2, H, P, A):
    """Token strides of q/k (TT, R, G, N) and their rank stride, of v (TT, H, P), of the per-rank dy
    (TT, R, H, P) and of the rotation planes (TT, H, 2, A)."""
    return R * G * 2 * N2, G * 2 * N2, H * P, R * H * P, H * 2 * A


@triton.jit
def qk_pointers(Q, K, QB, KB, ROT, g, h, R: tl.constexpr, N2, A):
    """q and k at group g, their biases and the rotation planes at head h: what ``rot_pair`` takes."""
    return Q + g * 2 * N2, K + g * 2 * N2, QB + h * R * 2 * N2, KB + h * R * 2 * N2, ROT + h * 2 * A


@triton.jit
def rows_of(ntok, R: tl.constexpr, BM: tl.constexpr):
    """(token offset, rank, valid) of the BM rows of a tile holding ``ntok`` tokens."""
    i = tl.arange(0, BM)
    t = i // R
    return t, i % R, t < ntok


@triton.jit
def bcast_tok(x, R: tl.constexpr, BM: tl.constexpr):
    """[CT, K] per-token values → [BM, K] rows (row i takes token i // R)."""
    CT: tl.constexpr = BM // R
    K: tl.constexpr = x.shape[1]
    return tl.reshape(tl.broadcast_to(tl.expand_dims(x, 1), (CT, R, K)), (BM, K))


@triton.jit
def bcast_rank(x, R: tl.constexpr, BM: tl.constexpr):
    """[R, K] per-rank values → [BM, K] rows (row i takes rank i % R)."""
    CT: tl.constexpr = BM // R
    K: tl.constexpr = x.shape[1]
    return tl.reshape(tl.broadcast_to(tl.expand_dims(x, 0), (CT, R, K)), (BM, K))


@triton.jit
def rot_pair(X, sx_t, sx_r, BIAS, ROT, srot_t, tok0, ntok, k0, N2, A, R: tl.constexpr, BM: tl.constexpr,
             BK: tl.constexpr, GATHER: tl.constexpr = False):
    """Biased, rotated pair block of the q or k rows of tokens [tok0, tok0 + ntok): (x̃1, x̃2, cos, sin), each
    [BM, BK] fp32. X points at (token 0, rank 0, group g, column 0); BIAS at bias[h] (R, N); ROT at the
    rotation planes' row (token 0, h): sin θ in its first A columns, cos θ in the next A (``rotation_planes``).
    cos and sin are loaded once per token and broadcast over the R ranks, the bias once per rank; with GATHER
    (``MimoConfig.scan_gather``) every row loads its own (R-fold repeated loads, cache hits) and nothing is
    broadcast through a reshape, which costs a layout conversion (shared memory and barriers) each. The values,
    hence the results, are the same either way."""
    CT: tl.constexpr = BM // R
    t, r, valid = rows_of(ntok, R, BM)
    kk = k0 + tl.arange(0, BK)
    km = kk < N2
    m = valid[:, None] & km[None, :]
    off = (tok0 + t).to(tl.int64)[:, None] * sx_t + r[:, None] * sx_r + kk[None, :]
    x1 = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(X + off + N2, mask=m, other=0.0).to(tl.float32)
    if GATHER:
        boff = r[:, None] * (2 * N2) + kk[None, :]
        b1 = tl.load(BIAS + boff, mask=km[None, :], other=0.0).to(tl.float32)
        b2 = tl.load(BIAS + boff + N2, mask=km[None, :], other=0.0).to(tl.float32)
    else:
        ro = tl.arange(0, R)
        boff = ro[:, None] * (2 * N2) + kk[None, :]
        b1 = bcast_rank(tl.load(BIAS + boff, mask=km[None, :], other=0.0).to(tl.float32), R, BM)
        b2 = bcast_rank(tl.load(BIAS + boff + N2, mask=km[None, :], other=0.0).to(tl.float32), R, BM)
    x1 = tl.where(m, x1 + b1, 0.0)
    x2 = tl.where(m, x2 + b2, 0.0)
    if GATHER:
        mt = valid[:, None] & (kk < A)[None, :]
        rot = ROT + (tok0 + t).to(tl.int64)[:, None] * srot_t + kk[None, :]
        s = tl.load(rot, mask=mt, other=0.0)  # columns ≥ A: no rotation
        c = tl.load(rot + A, mask=mt, other=1.0)
    else:
        tt = tl.arange(0, CT)
        mt = (tt < ntok)[:, None] & (kk < A)[None, :]
        rot = ROT + (tok0 + tt).to(tl.int64)[:, None] * srot_t + kk[None, :]
        s = bcast_tok(tl.load(rot, mask=mt, other=0.0), R, BM)  # [CT, BK] → [BM, BK]; columns ≥ A: no rotation
        c = bcast_tok(tl.load(rot + A, mask=mt, other=1.0), R, BM)
    return x1 * c - x2 * s, x1 * s + x2 * c, c, s


@triton.jit
def vtilde(V, sv_t, PSI, sp_r, tok0, ntok, P, R: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr,
           GATHER: tl.constexpr = False):
    """[BM, BP] rows ṽ_{t,r} = v_t ⊙ ψ_r for tokens [tok0, tok0 + ntok) (V at v[0, h], PSI at ψ[h]; ψ rows
    sp_r apart; P columns valid). GATHER: per-row loads, as in :func:`rot_pair`."""
    if GATHER:
        _t, r, valid = rows_of(ntok, R, BM)
        return load_tok_rows(V, sv_t, tok0, ntok, P, R, BM, BP, True) * load_rank_p(PSI, r, valid, sp_r, P, BP)
    CT: tl.constexpr = BM // R
    tt = tl.arange(0, CT)
    pp = tl.arange(0, BP)
    pm = pp < P
    v = tl.load(V + (tok0 + tt).to(tl.int64)[:, None] * sv_t + pp[None, :],
                mask=(tt < ntok)[:, None] & pm[None, :], other=0.0).to(tl.float32)
    ro = tl.arange(0, R)
    psi = tl.load(PSI + ro[:, None] * sp_r + pp[None, :], mask=pm[None, :], other=0.0).to(tl.float32)
    return bcast_tok(v, R, BM) * bcast_rank(psi, R, BM)


@triton.jit
def load_rows_p(X, sx_t, sx_r, tok, r, valid, P, BP: tl.constexpr):
    """[BM, BP] fp32 rows of a per-row (t, r) tensor (X at (row 0, h, 0)); sx_r = 0 repeats a per-token row."""
    pp = tl.arange(0, BP)
    m = valid[:, None] & (pp < P)[None, :]
    off = tok.to(tl.int64)[:, None] * sx_t + r[:, None] * sx_r + pp[None, :]
    return tl.load(X + off, mask=m, other=0.0).to(tl.float32)


@triton.jit
def store_rows_p(X, sx_t, sx_r, tok, r, valid, x, P):
    """Stores [BM, BP] rows x at a per-row (t, r) tensor, :func:`load_rows_p`'s layout, in X's dtype; P columns
    valid."""
    BP: tl.constexpr = x.shape[1]
    pp = tl.arange(0, BP)
    off = tok.to(tl.int64)[:, None] * sx_t + r[:, None] * sx_r + pp[None, :]
    tl.store(X + off, x.to(X.dtype.element_ty), mask=valid[:, None] & (pp < P)[None, :])


@triton.jit
def load_tok_rows(X, sx_t, tok0, ntok, P, R: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr,
                  GATHER: tl.constexpr = False):
    """[BM, BP] rows of a per-token tensor (X at (token 0, h, 0)): loaded once per token, broadcast over R (GATHER:
    once per row, as in :func:`rot_pair`)."""
    if GATHER:
        t, _r, valid = rows_of(ntok, R, BM)
        pp = tl.arange(0, BP)
        return tl.load(X + (tok0 + t).to(tl.int64)[:, None] * sx_t + pp[None, :],
                       mask=valid[:, None] & (pp < P)[None, :], other=0.0).to(tl.float32)
    CT: tl.constexpr = BM // R
    tt = tl.arange(0, CT)
    pp = tl.arange(0, BP)
    x = tl.load(X + (tok0 + tt).to(tl.int64)[:, None] * sx_t + pp[None, :],
                mask=(tt < ntok)[:, None] & (pp < P)[None, :], other=0.0).to(tl.float32)
    return bcast_tok(x, R, BM)


@triton.jit
def load_rank_p(X, r, valid, sx_r, P, BP: tl.constexpr):
    """[BM, BP] rows of a per-rank (R, ·) parameter (X at param[h] + column offset; row stride sx_r)."""
    pp = tl.arange(0, BP)
    m = valid[:, None] & (pp < P)[None, :]
    return tl.load(X + r[:, None] * sx_r + pp[None, :], mask=m, other=0.0).to(tl.float32)


@triton.jit
def load_state_pair(S, k0, N2, P, BP: tl.constexpr, BK: tl.constexpr):
    """The two [BP, BK] halves of a (P, N) state at pair block k0, in fp32 (the state kept in fp32, or its bf16 copy
    widened: ``MimoConfig.bwd_states16``)."""
    pp = tl.arange(0, BP)
    kk = k0 + tl.arange(0, BK)
    m = (pp < P)[:, None] & (kk < N2)[None, :]
    off = pp[:, None] * (2 * N2) + kk[None, :]
    return (tl.load(S + off, mask=m, other=0.0).to(tl.float32),
            tl.load(S + off + N2, mask=m, other=0.0).to(tl.float32))


@triton.jit
def state_block_ids(HG, N2, BP: tl.constexpr, BK: tl.constexpr):
    """(block, axis-1 id, head, group, first P column, first N pair) of a program on a (P blocks × N-pair blocks,
    ·, H) grid, N-pair blocks fastest."""
    pid = tl.program_id(0)
    h = tl.program_id(2)
    nkb = tl.cdiv(N2, BK)
    return pid, tl.program_id(1), h, h // HG, (pid // nkb) * BP, (pid % nkb) * BK


@triton.jit
def store_state_pair(S, s1, s2, k0, N2, P, BP: tl.constexpr, BK: tl.constexpr):
    """Stores the two [BP, BK] fp32 halves s1, s2 of a (P, N) state at pair block k0 (``load_state_pair``'s layout),
    rounded to S's dtype (fp32, or bf16 for ``MimoConfig.bwd_states16``'s copies)."""
    pp = tl.arange(0, BP)
    kk = k0 + tl.arange(0, BK)
    m = (pp < P)[:, None] & (kk < N2)[None, :]
    off = pp[:, None] * (2 * N2) + kk[None, :]
    tl.store(S + off, s1.to(S.dtype.element_ty), mask=m)
    tl.store(S + off + N2, s2.to(S.dtype.element_ty), mask=m)


@triton.jit
def token_decays(C, a0, na, b0, nb, CT: tl.constexpr):
    """[CT, CT] e^{c_later − c_earlier} between tokens a0 + a (rows) and b0 + b (columns), 1 for the same token (C
    at the head's (TT,) in-chunk cumsum). c never increases within a state chunk (adt ≤ 0, the operator's
    contract), so the exponent is −|c_a − c_b| whichever token is later, and it stays ≤ 0 for the absent tokens of
    a ragged tile too (they read c = 0): a valid token's decay against an absent one must not be e^{+|c|}, which
    is inf once the valid cumsum passes −88 and NaN against the absent row's zero score, carried into valid
    gradients by the contractions over query columns and the sums over rows
    (``test_strong_decay_with_ragged_tiles``)."""
    tt = tl.arange(0, CT)
    ca = tl.load(C + a0 + tt, mask=tt < na, other=0.0)
    cb = tl.load(C + b0 + tt, mask=tt < nb, other=0.0)
    return fast_exp(-tl.abs(ca[:, None] - cb[None, :]))


@triton.jit
def bcast_pairs(w, R: tl.constexpr, BM: tl.constexpr):
    """[CT, CT] per-token-pair values → [BM, BM] (row i takes token i // R, column j token j // R)."""
    CT: tl.constexpr = BM // R
    return tl.reshape(tl.broadcast_to(tl.expand_dims(tl.expand_dims(w, 1), 3), (CT, R, CT, R)), (BM, BM))


@triton.jit
def pair_block_ptrs(X, tile, h, slot, H, NSL, BM: tl.constexpr, TRANS: tl.constexpr = False):
    """[BM, BM] pointers of the row-major block X[tile, h, slot] of per-(row, column) pair values, X (token tiles,
    H, NSL, BM, BM) (``MimoConfig.bwd_store_dpw``: the one layout its writer and readers share); TRANS: of its
    transpose (loading the transpose through them is no layout conversion)."""
    i = tl.arange(0, BM)
    block = X + ((tile * H + h).to(tl.int64) * NSL + slot) * BM * BM
    if TRANS:
        return block + i[:, None] + i[None, :] * BM
    return block + i[:, None] * BM + i[None, :]


@triton.jit
def load_pair_block(X, tile, h, slot, H, NSL, BM: tl.constexpr, PREC: tl.constexpr, TRANS: tl.constexpr = False):
    """The block X[tile, h, slot] of :func:`pair_block_ptrs` (TRANS: its transpose) as a dot at PREC takes it: as
    stored for 16-bit PREC (then stored in that dtype), fp32 otherwise (bf16 blocks, ``MimoConfig.dpw16``,
    widened)."""
    x = tl.load(pair_block_ptrs(X, tile, h, slot, H, NSL, BM, TRANS))
    if PREC != "bf16" and PREC != "fp16":  # one return: compiled Triton rejects returns of two dtypes
        x = x.to(tl.float32)
    return x


@triton.jit
def later_mask(a0, b0, CT: tl.constexpr, KEYS_ON_ROWS: tl.constexpr):
    """[CT, CT] (strict, same): the query token later than the key token / the same token, for row tokens a0 + a
    and column tokens b0 + b; the keys are the columns unless KEYS_ON_ROWS."""
    ta = (a0 + tl.arange(0, CT))[:, None]
    tb = (b0 + tl.arange(0, CT))[None, :]
    return (tb > ta if KEYS_ON_ROWS else ta > tb), ta == tb


@triton.jit
def token_weights(e, strict, same, SCL, GAM, a0, na, b0, nb, CT: tl.constexpr, KEYS_ON_ROWS: tl.constexpr):
    """[CT, CT] decay weights from the token decays e and the masks of :func:`later_mask`: e·scale_k where the query
    token is later than the key token k, γ for the same token, 0 otherwise (see :func:`pair_weights`)."""
    tt = tl.arange(0, CT)
    if KEYS_ON_ROWS:
        sc = tl.load(SCL + a0 + tt, mask=tt < na, other=0.0)[:, None]
    else:
        sc = tl.load(SCL + b0 + tt, mask=tt < nb, other=0.0)[None, :]
    g = tl.load(GAM + a0 + tt, mask=tt < na, other=0.0)[:, None]
    return tl.where(strict, e * sc, tl.where(same, g, 0.0))


@triton.jit
def pair_weights(C, SCL, GAM, a0, na, b0, nb, R: tl.constexpr, BM: tl.constexpr, KEYS_ON_ROWS: tl.constexpr):
    """[BM, BM] decay weights W between the (token, rank) rows of tokens [a0, a0 + na) and the columns of tokens
    [b0, b0 + nb): e^{c_q − c_k}·scale_k where the query token q is later than the key token k, γ for the same
    token, 0 otherwise; keys on the columns (queries on the rows) unless KEYS_ON_ROWS. Computed per token pair,
    [CT, CT], and broadcast over the ranks: R² fewer exponentials and selects than per (row, column) (AOT sm_90,
    bf16, P = 64: the output kernel 3344 → 3160 instructions and 255 → 189 registers)."""
    CT: tl.constexpr = BM // R
    strict, same = later_mask(a0, b0, CT, KEYS_ON_ROWS)
    w = token_weights(token_decays(C, a0, na, b0, nb, CT), strict, same, SCL, GAM, a0, na, b0, nb, CT, KEYS_ON_ROWS)
    return bcast_pairs(w, R, BM)
