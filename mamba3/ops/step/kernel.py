"""Triton kernel of the one-token decode step (SISO and MIMO), states updated in place.

One program per (batch row, head). It owns the whole (P × N) fp32 state of that head, so reading the previous
k̃/v/θ and writing the new ones cannot race with another program (splitting P across programs would: every P
tile needs the old k̃ and θ that another tile may already have overwritten). The state is streamed in N tiles
of BLOCK_N columns × all P rows; the outputs y_r = h' q̃_r accumulate over the tiles, so the output stage
(RMSNorm over P, gate, rank contraction) runs once at the end on complete rows.

Rotation: dimension n of x is rotated with its partner dimension p(n) by θ_j(n):
  adjacent pairs (SISO): j = n // 2, p(n) = n xor 1, x'[n] = x[n]·cos θ_j ∓ x[p(n)]·sin θ_j (− for even n);
  half split (MIMO):     j = n mod N/2, p(n) = n ± N/2, − for n < N/2;
dimensions with j ≥ A pass through. The partner values are loaded by a gather from global memory (q, k and
the biases are read-only here), so any N (even) and any tile split work. θ is recomputed per dimension from
the old angle state with the same arithmetic as the stored new angle, so they agree bit for bit. In-place
updates are separated from the reads of the old values by barriers: a 1-D row (k̃, θ, v) is held by several
threads, and Triton orders a store after a load of the same address only within one thread. The new k̃ of a
tile is stored after the barrier that follows its state update; θ and v after the N loop and a barrier.

Everything is computed in fp32 whatever the input dtype; states are loaded and stored in their own dtype.
No host synchronisation, no data-dependent allocation: the launch is CUDA-graph capturable, and
``state_batch_indices`` (loaded in the kernel) may change between graph replays. A negative index skips the
row (output zeros, states untouched), like a padded slot in a serving engine.
"""
from __future__ import annotations

import triton
import triton.language as tl

PI = tl.constexpr(3.141592653589793)
TWO_PI = tl.constexpr(6.283185307179586)


@triton.jit
def _wrap(th):
    """θ mod 2π in [0, 2π) (the two selects fix rounding at the ends)."""
    th = th - TWO_PI * tl.floor(th * (1.0 / TWO_PI))
    th = tl.where(th < 0.0, th + TWO_PI, th)
    return tl.where(th >= TWO_PI, th - TWO_PI, th)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _rotated(x_ptr, b_ptr, nn, pn, nmask, c, s):
    """R(θ)(x + b) on the dimensions nn, from x and the bias at nn and at the partners pn."""
    x = (tl.load(x_ptr + nn, mask=nmask, other=0.0).to(tl.float32)
         + tl.load(b_ptr + nn, mask=nmask, other=0.0).to(tl.float32))
    xp = (tl.load(x_ptr + pn, mask=nmask, other=0.0).to(tl.float32)
          + tl.load(b_ptr + pn, mask=nmask, other=0.0).to(tl.float32))
    return x * c + xp * s


@triton.jit
def mamba3_step_kernel(
    q_ptr, k_ptr, v_ptr, z_ptr, adt_ptr, dt_ptr, trap_ptr, ang_ptr,
    qb_ptr, kb_ptr, D_ptr, mv_ptr, mz_ptr, mo_ptr, nw_ptr,
    sa_ptr, ss_ptr, sk_ptr, sv_ptr, sbi_ptr, out_ptr,
    stride_qb, stride_qr, stride_qg, stride_kb, stride_kr, stride_kg,
    stride_vb, stride_vh, stride_zb, stride_zh, stride_angb, stride_angh,
    stride_sab, stride_sah, stride_ssb, stride_ssh, stride_ssp,
    stride_skb, stride_skr, stride_skh, stride_svb, stride_svh,
    H, heads_per_group, P, A, norm_eps,
    N: tl.constexpr,
    R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_A: tl.constexpr, ADJACENT: tl.constexpr, HAS_SBI: tl.constexpr, HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_PSI: tl.constexpr, HAS_ZETA: tl.constexpr, HAS_PHI: tl.constexpr,
    PER_RANK: tl.constexpr, RMS_NORM: tl.constexpr, HAS_NW: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    if HAS_SBI:
        srow = tl.load(sbi_ptr + b).to(tl.int64)
    else:
        srow = b.to(tl.int64)
    b = b.to(tl.int64)
    pp = tl.arange(0, BLOCK_P)
    pmask = pp < P
    rr = tl.arange(0, BLOCK_R)
    rmask = rr < R
    if srow >= 0:
        g = h // heads_per_group
        a = tl.load(adt_ptr + b * H + h).to(tl.float32)
        dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
        lam = tl.sigmoid(tl.load(trap_ptr + b * H + h).to(tl.float32))
        alpha = tl.exp(a)
        gamma = lam * dt
        beta = (1.0 - lam) * dt * alpha

        sa_row = sa_ptr + srow * stride_sab + h * stride_sah
        ang_row = ang_ptr + b * stride_angb + h * stride_angh
        ss_row = ss_ptr + srow * stride_ssb + h * stride_ssh
        sk_row = sk_ptr + srow * stride_skb + h * stride_skh
        q_row = q_ptr + b * stride_qb + g * stride_qg
        k_row = k_ptr + b * stride_kb + g * stride_kg

        # new angles θ'_j for j < A (stored after the N loop)
        jj = tl.arange(0, BLOCK_A)
        jmask = jj < A
        th_new = _wrap(tl.load(sa_row + jj, mask=jmask, other=0.0).to(tl.float32)
                       + PI * _tanh(tl.load(ang_row + jj, mask=jmask, other=0.0).to(tl.float32)) * dt)

        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + pp, mask=pmask, other=0.0).to(tl.float32)
        sv_row = sv_ptr + srow * stride_svb + h * stride_svh
        vprev = tl.load(sv_row + pp, mask=pmask, other=0.0).to(tl.float32)
        u_new = gamma * v
        u_old = beta * vprev

        y = tl.zeros((BLOCK_R, BLOCK_P), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            nn = n0 + tl.arange(0, BLOCK_N)
            nmask = nn < N
            hmask = pmask[:, None] & nmask[None, :]
            hptr = ss_row + pp[:, None] * stride_ssp + nn[None, :]
            state = tl.load(hptr, mask=hmask, other=0.0).to(tl.float32)     # issue the big load first
            if ADJACENT:
                j = nn // 2
                pn = nn ^ 1
                sign = tl.where((nn % 2) == 0, -1.0, 1.0)
            else:
                half = N // 2
                first = nn < half
                j = tl.where(first, nn, nn - half)
                pn = tl.where(first, nn + half, nn - half)
                sign = tl.where(first, -1.0, 1.0)
            rot = (j < A) & nmask
            th = _wrap(tl.load(sa_row + j, mask=rot, other=0.0).to(tl.float32)
                       + PI * _tanh(tl.load(ang_row + j, mask=rot, other=0.0).to(tl.float32)) * dt)
            c = tl.where(rot, tl.cos(th), 1.0)
            s = tl.where(rot, tl.sin(th), 0.0) * sign

            state = alpha * state
            k_new = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)  # this tile's new k̃ rows, stored below
            for r in tl.static_range(R):
                k_rot = _rotated(k_row + r * stride_kr, kb_ptr + (h * R + r) * N, nn, pn, nmask, c, s)
                k_old = tl.load(sk_row + r * stride_skr + nn, mask=nmask, other=0.0).to(tl.float32)
                if HAS_PSI:
                    psi = tl.load(mv_ptr + (h * R + r) * P + pp, mask=pmask, other=0.0).to(tl.float32)
                    state += (u_new * psi)[:, None] * k_rot[None, :] + (u_old * psi)[:, None] * k_old[None, :]
                else:
                    state += u_new[:, None] * k_rot[None, :] + u_old[:, None] * k_old[None, :]
                k_new = tl.where(rr[:, None] == r, k_rot[None, :], k_new)
            tl.store(hptr, state.to(ss_ptr.dtype.element_ty), mask=hmask)
            # A [BLOCK_N] row is replicated over several threads: without a barrier one thread could store the
            # new k̃ before another has loaded the old one (a race seen on the H200 at 8 warps: MIMO decode off by
            # 1e-2, and eager and compiled steps disagreeing). Every thread has its k_old once it passes here.
            tl.debug_barrier()
            tl.store(sk_row + rr[:, None] * stride_skr + nn[None, :], k_new.to(sk_ptr.dtype.element_ty),
                     mask=rmask[:, None] & nmask[None, :])
            for r in tl.static_range(R):
                q_rot = _rotated(q_row + r * stride_qr, qb_ptr + (h * R + r) * N, nn, pn, nmask, c, s)
                y_r = tl.sum(state * q_rot[None, :], axis=1)
                y += tl.where(rr[:, None] == r, y_r[None, :], 0.0)

        # the old angle and v states are read by every thread (θ per tile above, v_prev before the loop): no
        # thread may overwrite them before all have read them
        tl.debug_barrier()
        tl.store(sa_row + jj, th_new.to(sa_ptr.dtype.element_ty), mask=jmask)
        tl.store(sv_row + pp, v.to(sv_ptr.dtype.element_ty), mask=pmask)

        # output stage on complete rows y (R × P)
        rp = (h * R + rr[:, None]) * P + pp[None, :]
        rpmask = rmask[:, None] & pmask[None, :]
        if HAS_D:
            Dh = tl.load(D_ptr + h).to(tl.float32)
            if HAS_PSI:
                y += Dh * v[None, :] * tl.load(mv_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
            else:
                y += Dh * v[None, :]
        y = tl.where(rpmask, y, 0.0)
        if RMS_NORM:
            ms = tl.sum(y * y, axis=1) / P
            y = y * tl.rsqrt(ms + norm_eps)[:, None]
            if HAS_NW:
                y = y * tl.load(nw_ptr + h * P + pp, mask=pmask, other=0.0).to(tl.float32)[None, :]
        if HAS_Z:
            zz = tl.load(z_ptr + b * stride_zb + h * stride_zh + pp, mask=pmask, other=0.0).to(tl.float32)
            if HAS_ZETA:
                gate = zz[None, :] * tl.load(mz_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
            else:
                gate = zz[None, :] + tl.zeros((BLOCK_R, BLOCK_P), dtype=tl.float32)
            y = y * gate * tl.sigmoid(gate)
        if PER_RANK:
            optr = out_ptr + ((b * R + rr[:, None]) * H + h) * P + pp[None, :]
            tl.store(optr, y.to(out_ptr.dtype.element_ty), mask=rpmask)
        else:
            if HAS_PHI:
                y = y * tl.load(mo_ptr + rp, mask=rpmask, other=0.0).to(tl.float32)
            o = tl.sum(y, axis=0)
            tl.store(out_ptr + (b * H + h) * P + pp, o.to(out_ptr.dtype.element_ty), mask=pmask)
    else:
        if PER_RANK:
            optr = out_ptr + ((b * R + rr[:, None]) * H + h) * P + pp[None, :]
            tl.store(optr, tl.zeros((BLOCK_R, BLOCK_P), dtype=out_ptr.dtype.element_ty),
                     mask=rmask[:, None] & pmask[None, :])
        else:
            tl.store(out_ptr + (b * H + h) * P + pp, tl.zeros((BLOCK_P,), dtype=out_ptr.dtype.element_ty),
                     mask=pmask)
