"""Triton kernels of the one-token decode step (SISO and MIMO), states updated in place.

Two launches, so that no program ever reads a value another program may already have overwritten:

* ``mamba3_step_kernel`` — grid (batch row, head, P tile). Streams its BLOCK_P rows of the fp32 (P × N) state
  in tiles of BLOCK_P × BLOCK_N, updates them in place and accumulates the outputs y_r = h' q̃_r over the tiles;
  the output stage (D, RMSNorm over P, gate, rank contraction) runs once at the end on complete rows. It only
  *reads* the small k̃/θ/v states, so the state can be split over P into many small programs: the step is pure
  bandwidth, and many small programs in flight per SM are what hides the memory latency (one program per
  (row, head) owning all of P reached ~70 % of the copy bandwidth on the H200).
* ``mamba3_step_rows_kernel`` — grid (batch row, head), launched after it: writes the new angle state θ', the
  new rotated k̃ rows and v. It reads the old θ before overwriting it: a row is replicated over threads, so a
  barrier separates the loads from the stores (Triton orders a store after a load of the same address only
  within one thread).

One launch, with the last P-tile program of each (row, head) to finish (an acquire-release atomic count) writing
θ', k̃ and v, was measured slower on the H200 at batch 1, 8 and 128 (SISO 5.38 / 13.2 / 161 µs against 5.07 /
9.5 / 154 µs): the last arriver's serial tail costs more than the second launch saves.

Rotation: dimension n of x is rotated with its partner dimension p(n) by θ_j(n):
  adjacent pairs (SISO): j = n // 2, p(n) = n xor 1, x'[n] = x[n]·cos θ_j ∓ x[p(n)]·sin θ_j (− for even n);
  half split (MIMO):     j = n mod N/2, p(n) = n ± N/2, − for n < N/2;
dimensions with j ≥ A pass through. The state kernel rotates every pair in registers, one angle per pair and no
partner loads: SISO's tiles are runs of dimensions starting at an even one (both members of each adjacent pair);
MIMO's tiles are pair blocks, BLOCK_N/2 columns [j0, j0 + BLOCK_N/2) of the first half with the same columns of
the second half, held as two half tiles (where loading each dimension's partner by a gather read q, k and their
biases twice and computed every angle twice). The rows kernel, which runs once per (row, head), gathers the
partners. Both kernels compute θ' with the same helper from the old angle state, so the angles used for q̃/k̃
and the stored θ' agree bit for bit.

The state's row stride is a compile-time constant (N for every cache this package allocates): the rows of a
tile are then one base address plus immediate offsets, where a runtime stride kept a 64-bit address per row live
from the load to the store (AOT sm_90, SISO 16 × 128 tile: 168 → 128 registers; MIMO R = 4 on the H200:
0.272 → 0.254 ms).

Everything is computed in fp32 whatever the input dtype; states are loaded and stored in their own dtype.
No host synchronisation, no data-dependent allocation: the launches are CUDA-graph capturable, and
``state_batch_indices`` (loaded in the kernels) may change between graph replays. A negative index skips the
row (output zeros, states untouched), like a padded slot in a serving engine.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.tiles import PI, sincos

TWO_PI = tl.constexpr(6.283185307179586)


@triton.jit
def _wrap(th):
    """θ mod 2π in [0, 2π) (the two selects fix rounding at the ends)."""
    th = th - TWO_PI * tl.floor(th * (1.0 / TWO_PI))
    th = tl.where(th < 0.0, th + TWO_PI, th)
    return tl.where(th >= TWO_PI, th - TWO_PI, th)


@triton.jit
def _new_angle(sa_row, ang_row, j, mask, dt):
    """θ'_j = (θ_j + π·tanh(φ_j)·dt) mod 2π from the old angle state row and the angle rates row. tanh is
    2σ(2x) − 1 with tl.sigmoid, not the chunk kernels' fast_sigmoid: the step is bandwidth-bound, and with the
    fast path the pooled (state_batch_indices) and dense variants of the kernel stopped agreeing bit for bit."""
    th = tl.load(sa_row + j, mask=mask, other=0.0).to(tl.float32)
    tanh_rate = 2.0 * tl.sigmoid(2.0 * tl.load(ang_row + j, mask=mask, other=0.0).to(tl.float32)) - 1.0
    return _wrap(th + PI * tanh_rate * dt)


@triton.jit
def _rotation(sa_row, ang_row, nn, dt, N: tl.constexpr, A, ADJACENT: tl.constexpr):
    """(partner dimension, cos, signed sin) rotating the dimensions nn by θ'."""
    nmask = nn < N
    if ADJACENT:
        j = nn // 2
        partner = nn ^ 1
        sign = tl.where((nn % 2) == 0, -1.0, 1.0)
    else:
        first = nn < N // 2
        j = tl.where(first, nn, nn - N // 2)
        partner = tl.where(first, nn + N // 2, nn - N // 2)
        sign = tl.where(first, -1.0, 1.0)
    rot = (j < A) & nmask
    si, co = sincos(_new_angle(sa_row, ang_row, j, rot, dt))   # θ' ∈ [0, 2π): the short polynomial suffices
    return partner, tl.where(rot, co, 1.0), tl.where(rot, si, 0.0) * sign


@triton.jit
def _rotated(x_ptr, b_ptr, nn, pn, nmask, c, s):
    """R(θ)(x + b) on the dimensions nn (any shape), from x and the bias at nn and at the partners pn."""
    x = (tl.load(x_ptr + nn, mask=nmask, other=0.0).to(tl.float32)
         + tl.load(b_ptr + nn, mask=nmask, other=0.0).to(tl.float32))
    xp = (tl.load(x_ptr + pn, mask=nmask, other=0.0).to(tl.float32)
          + tl.load(b_ptr + pn, mask=nmask, other=0.0).to(tl.float32))
    return x * c + xp * s


@triton.jit
def _pair_rotation(sa_row, ang_row, jj, dt, A):
    """(cos θ', sin θ') of the pairs jj (pairs j ≥ A: the identity), adjacent or half-split alike: one angle per
    pair, where the per-dimension form computes it for both dimensions of the pair."""
    rot = jj < A
    si, co = sincos(_new_angle(sa_row, ang_row, jj, rot, dt))
    return tl.where(rot, co, 1.0), tl.where(rot, si, 0.0)


@triton.jit
def _rotated_pairs(x_ptr, b_ptr, nn, nmask, c, s, BLOCK_N: tl.constexpr):
    """R(θ)(x + b) on BLOCK_N dimensions nn that start at an even one, by adjacent pairs split in registers (no
    partner loads)."""
    x = (tl.load(x_ptr + nn, mask=nmask, other=0.0).to(tl.float32)
         + tl.load(b_ptr + nn, mask=nmask, other=0.0).to(tl.float32))
    xe, xo = tl.split(tl.reshape(x, (BLOCK_N // 2, 2)))
    return tl.reshape(tl.join(xe * c - xo * s, xe * s + xo * c), (BLOCK_N,))


@triton.jit
def _rotated_halves(x_ptr, b_ptr, jj, jmask, c, s, N2):
    """R(θ)(x + b) on the half-split pairs jj: (first-half columns jj, second-half columns N2 + jj)."""
    x1 = (tl.load(x_ptr + jj, mask=jmask, other=0.0).to(tl.float32)
          + tl.load(b_ptr + jj, mask=jmask, other=0.0).to(tl.float32))
    x2 = (tl.load(x_ptr + N2 + jj, mask=jmask, other=0.0).to(tl.float32)
          + tl.load(b_ptr + N2 + jj, mask=jmask, other=0.0).to(tl.float32))
    return x1 * c - x2 * s, x1 * s + x2 * c


@triton.jit
def _rank_inputs(u_new, u_old, psi_row, pp, pmask, HAS_PSI: tl.constexpr):
    """The rows' γv and βv_prev scaled by the rank's ψ (MIMO_V) when there is one."""
    if HAS_PSI:
        psi = tl.load(psi_row + pp, mask=pmask, other=0.0).to(tl.float32)
        return u_new * psi, u_old * psi
    else:
        return u_new, u_old


@triton.jit
def _write_small_states(k_row, stride_kr, kb_h, v_row, dt, sa_row, ang_row, sk_row, stride_skr, sv_row, P, A,
                        N: tl.constexpr, R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_A: tl.constexpr, ADJACENT: tl.constexpr):
    """θ' (A), k̃' (R × N) and v (P) of one (row, head) into its angle, k and v state rows. The old θ is read
    first; a barrier keeps every thread's reads before any thread's stores (a row is replicated over threads)."""
    jj = tl.arange(0, BLOCK_A)
    th_new = _new_angle(sa_row, ang_row, jj, jj < A, dt)
    nn = tl.arange(0, BLOCK_N)
    nmask = nn < N
    pn, c, s = _rotation(sa_row, ang_row, nn, dt, N, A, ADJACENT)
    rr = tl.arange(0, BLOCK_R)
    rnmask = (rr < R)[:, None] & nmask[None, :]
    k_new = _rotated(k_row + rr[:, None] * stride_kr, kb_h + rr[:, None] * N, nn[None, :], pn[None, :], rnmask,
                     c[None, :], s[None, :])
    pp = tl.arange(0, BLOCK_P)
    v = tl.load(v_row + pp, mask=pp < P)
    tl.debug_barrier()
    tl.store(sa_row + jj, th_new.to(sa_row.dtype.element_ty), mask=jj < A)
    tl.store(sk_row + rr[:, None] * stride_skr + nn[None, :], k_new.to(sk_row.dtype.element_ty), mask=rnmask)
    tl.store(sv_row + pp, v.to(sv_row.dtype.element_ty), mask=pp < P)


@triton.jit
def _state_row(sbi_ptr, b, HAS_SBI: tl.constexpr):
    """The state row of batch row b (negative: a padded slot)."""
    if HAS_SBI:
        return tl.load(sbi_ptr + b).to(tl.int64)
    else:
        return b.to(tl.int64)


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
    ADJACENT: tl.constexpr, HAS_SBI: tl.constexpr, HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_PSI: tl.constexpr, HAS_ZETA: tl.constexpr, HAS_PHI: tl.constexpr,
    PER_RANK: tl.constexpr, RMS_NORM: tl.constexpr, HAS_NW: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_N // 2   # half-split tiles: BLOCK_N columns = HALF pairs
    N2: tl.constexpr = N // 2
    b = tl.program_id(0)
    h = tl.program_id(1)
    srow = _state_row(sbi_ptr, b, HAS_SBI)
    b = b.to(tl.int64)
    pp = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = pp < P
    rr = tl.arange(0, BLOCK_R)
    # (P, R) orientation of the rank outputs: a row reduction of the state tile lands in it without a layout change
    rp = (h * R + rr[None, :]) * P + pp[:, None]
    rpmask = pmask[:, None] & (rr < R)[None, :]
    if srow >= 0:
        g = h // heads_per_group
        ss_row = ss_ptr + srow * stride_ssb + h * stride_ssh
        sa_row = sa_ptr + srow * stride_sab + h * stride_sah
        sk_row = sk_ptr + srow * stride_skb + h * stride_skh
        ang_row = ang_ptr + b * stride_angb + h * stride_angh
        q_row = q_ptr + b * stride_qb + g * stride_qg
        k_row = k_ptr + b * stride_kb + g * stride_kg
        # The loads nothing else waits for are issued before any arithmetic, the state tile first (warps issue
        # in order: an early use of a loaded value would hold back every load behind it).
        if ADJACENT:
            nn = tl.arange(0, BLOCK_N)
            hmask = pmask[:, None] & (nn < N)[None, :]
            state = tl.load(ss_row + pp[:, None] * stride_ssp + nn[None, :], mask=hmask, other=0.0,
                            eviction_policy="evict_first")
        else:  # the first pair block: columns [0, HALF) of both halves
            jj = tl.arange(0, HALF)
            hmask = pmask[:, None] & (jj < N2)[None, :]
            lo_ptr = ss_row + pp[:, None] * stride_ssp + jj[None, :]
            state_lo = tl.load(lo_ptr, mask=hmask, other=0.0, eviction_policy="evict_first")
            state_hi = tl.load(lo_ptr + N2, mask=hmask, other=0.0, eviction_policy="evict_first")
        a = tl.load(adt_ptr + b * H + h)
        dt = tl.load(dt_ptr + b * H + h)
        trap = tl.load(trap_ptr + b * H + h)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + pp, mask=pmask, other=0.0).to(tl.float32)
        vprev = tl.load(sv_ptr + srow * stride_svb + h * stride_svh + pp, mask=pmask, other=0.0).to(tl.float32)
        if HAS_Z:
            zz = tl.load(z_ptr + b * stride_zb + h * stride_zh + pp, mask=pmask, other=0.0).to(tl.float32)
        if HAS_D:
            Dh = tl.load(D_ptr + h).to(tl.float32)

        dt = dt.to(tl.float32)
        lam = tl.sigmoid(trap.to(tl.float32))
        alpha = tl.exp(a.to(tl.float32))
        u_new = (lam * dt) * v                      # γ v
        u_old = ((1.0 - lam) * dt * alpha) * vprev  # β v_prev

        y = tl.zeros((BLOCK_P, BLOCK_R), dtype=tl.float32)
        if ADJACENT:
            for n0 in range(0, N, BLOCK_N):
                nn = n0 + tl.arange(0, BLOCK_N)
                nmask = nn < N
                hptr = ss_row + pp[:, None] * stride_ssp + nn[None, :]
                if N > BLOCK_N:  # prefetch the next tile (masked off after the last one) while this one is updated
                    next_mask = pmask[:, None] & (nn + BLOCK_N < N)[None, :]
                    state_next = tl.load(hptr + BLOCK_N, mask=next_mask, other=0.0, eviction_policy="evict_first")
                c, s = _pair_rotation(sa_row, ang_row, n0 // 2 + tl.arange(0, BLOCK_N // 2), dt, A)
                state = alpha * state.to(tl.float32)
                for r in tl.static_range(R):
                    k_rot = _rotated_pairs(k_row + r * stride_kr, kb_ptr + (h * R + r) * N, nn, nmask, c, s, BLOCK_N)
                    k_old = tl.load(sk_row + r * stride_skr + nn, mask=nmask, other=0.0).to(tl.float32)
                    un, uo = _rank_inputs(u_new, u_old, mv_ptr + (h * R + r) * P, pp, pmask, HAS_PSI)
                    state += un[:, None] * k_rot[None, :] + uo[:, None] * k_old[None, :]
                # y before the store: the q loads can then be hoisted (no load moves above a possibly aliasing store)
                for r in tl.static_range(R):
                    q_rot = _rotated_pairs(q_row + r * stride_qr, qb_ptr + (h * R + r) * N, nn, nmask, c, s,
                                           BLOCK_N)
                    y += tl.where(rr[None, :] == r, tl.sum(state * q_rot[None, :], axis=1)[:, None], 0.0)
                tl.store(hptr, state.to(ss_ptr.dtype.element_ty), mask=hmask, eviction_policy="evict_first")
                if N > BLOCK_N:
                    state, hmask = state_next, next_mask
        else:  # half split: pair blocks [j0, j0 + HALF) of both halves, so a pair's two columns share a thread
            for j0 in range(0, N2, HALF):
                jj = j0 + tl.arange(0, HALF)
                jmask = jj < N2
                lo_ptr = ss_row + pp[:, None] * stride_ssp + jj[None, :]
                if N2 > HALF:  # prefetch the next pair block
                    next_mask = pmask[:, None] & (jj + HALF < N2)[None, :]
                    next_lo = tl.load(lo_ptr + HALF, mask=next_mask, other=0.0, eviction_policy="evict_first")
                    next_hi = tl.load(lo_ptr + HALF + N2, mask=next_mask, other=0.0, eviction_policy="evict_first")
                c, s = _pair_rotation(sa_row, ang_row, jj, dt, A)  # A ≤ N/2: masked pairs are not rotated
                state_lo = alpha * state_lo.to(tl.float32)
                state_hi = alpha * state_hi.to(tl.float32)
                for r in tl.static_range(R):
                    k1, k2 = _rotated_halves(k_row + r * stride_kr, kb_ptr + (h * R + r) * N, jj, jmask, c, s, N2)
                    ko_row = sk_row + r * stride_skr
                    ko1 = tl.load(ko_row + jj, mask=jmask, other=0.0).to(tl.float32)
                    ko2 = tl.load(ko_row + N2 + jj, mask=jmask, other=0.0).to(tl.float32)
                    un, uo = _rank_inputs(u_new, u_old, mv_ptr + (h * R + r) * P, pp, pmask, HAS_PSI)
                    state_lo += un[:, None] * k1[None, :] + uo[:, None] * ko1[None, :]
                    state_hi += un[:, None] * k2[None, :] + uo[:, None] * ko2[None, :]
                for r in tl.static_range(R):
                    q1, q2 = _rotated_halves(q_row + r * stride_qr, qb_ptr + (h * R + r) * N, jj, jmask, c, s, N2)
                    yr = tl.sum(state_lo * q1[None, :] + state_hi * q2[None, :], axis=1)
                    y += tl.where(rr[None, :] == r, yr[:, None], 0.0)
                tl.store(lo_ptr, state_lo.to(ss_ptr.dtype.element_ty), mask=hmask, eviction_policy="evict_first")
                tl.store(lo_ptr + N2, state_hi.to(ss_ptr.dtype.element_ty), mask=hmask,
                         eviction_policy="evict_first")
                if N2 > HALF:
                    state_lo, state_hi, hmask = next_lo, next_hi, next_mask

        # output stage on complete rows: y is (P, R)
        if HAS_D:
            if HAS_PSI:
                y += Dh * v[:, None] * tl.load(mv_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
            else:
                y += Dh * v[:, None]
        y = tl.where(rpmask, y, 0.0)
        if RMS_NORM:  # the launcher makes one P tile hold all of P
            ms = tl.sum(y * y, axis=0) / P
            y = y * tl.rsqrt(ms + norm_eps)[None, :]
            if HAS_NW:
                y = y * tl.load(nw_ptr + h * P + pp, mask=pmask, other=0.0).to(tl.float32)[:, None]
        if HAS_Z:
            if HAS_ZETA:
                gate = zz[:, None] * tl.load(mz_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
            else:
                gate = zz[:, None] + tl.zeros((BLOCK_P, BLOCK_R), dtype=tl.float32)
            y = y * gate * tl.sigmoid(gate)
        if PER_RANK:
            optr = out_ptr + ((b * R + rr[None, :]) * H + h) * P + pp[:, None]
            tl.store(optr, y.to(out_ptr.dtype.element_ty), mask=rpmask)
        else:
            if HAS_PHI:
                y = y * tl.load(mo_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
            tl.store(out_ptr + (b * H + h) * P + pp, tl.sum(y, axis=1).to(out_ptr.dtype.element_ty), mask=pmask)
    else:
        if PER_RANK:
            optr = out_ptr + ((b * R + rr[None, :]) * H + h) * P + pp[:, None]
            tl.store(optr, tl.zeros((BLOCK_P, BLOCK_R), dtype=out_ptr.dtype.element_ty), mask=rpmask)
        else:
            tl.store(out_ptr + (b * H + h) * P + pp, tl.zeros((BLOCK_P,), dtype=out_ptr.dtype.element_ty),
                     mask=pmask)


@triton.jit
def mamba3_step_rows_kernel(
    k_ptr, v_ptr, dt_ptr, ang_ptr, kb_ptr, sa_ptr, sk_ptr, sv_ptr, sbi_ptr,
    stride_kb, stride_kr, stride_kg, stride_vb, stride_vh, stride_angb, stride_angh,
    stride_sab, stride_sah, stride_skb, stride_skr, stride_skh, stride_svb, stride_svh,
    H, heads_per_group, P, A,
    N: tl.constexpr, R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_A: tl.constexpr, ADJACENT: tl.constexpr, HAS_SBI: tl.constexpr,
):
    """The new small states of one (row, head): θ' (A), k̃ (R × N) and v (P), after mamba3_step_kernel."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    srow = _state_row(sbi_ptr, b, HAS_SBI)
    b = b.to(tl.int64)
    if srow >= 0:
        g = h // heads_per_group
        dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
        _write_small_states(k_ptr + b * stride_kb + g * stride_kg, stride_kr, kb_ptr + h * R * N,
                            v_ptr + b * stride_vb + h * stride_vh, dt, sa_ptr + srow * stride_sab + h * stride_sah,
                            ang_ptr + b * stride_angb + h * stride_angh, sk_ptr + srow * stride_skb + h * stride_skh,
                            stride_skr, sv_ptr + srow * stride_svb + h * stride_svh, P, A, N, R, BLOCK_R, BLOCK_P,
                            BLOCK_N, BLOCK_A, ADJACENT)
