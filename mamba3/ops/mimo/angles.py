"""Angle cumsum for the MIMO kernels, θ_t = (θ_init + Σ_{s≤t} π·tanh(φ_s)·dt_s) mod 2π in fp32, and its
backward.

One program per (sequence, head) walks the sequence in blocks of BT tokens: an fp32 cumsum inside the block
plus the carried angle, wrapped into [0, 2π) after every block, so the magnitude (and the rounding) never
grows with T. Backward: G_s = Σ_{t≥s} dθ_t (a reverse walk; the final angle's gradient arrives through θ of
the last token), dφ = π·(1 − tanh²φ)·dt·G, ddt = Σ_a π·tanh(φ)·G, dθ_init = G_0. The mod is the identity for
gradients.
tanh is 2·σ(2x) − 1 (``common.tiles.fast_sigmoid``: libdevice's fast path compiled, tl.sigmoid under the interpreter).

TODO(merge): ``mamba3.ops.common.cumsum`` (SISO) carries the same sums chunk-parallel; switch to it once its
chunk tables and ours are unified.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..common.tiles import fast_sigmoid

TWO_PI = 2.0 * math.pi


@triton.jit
def mimo_angle_fwd_kernel(PHI, sphi_t, sphi_h, DT, TH0, TH, SEQ_START, SEQ_END, H, A,
                          HAS_TH0: tl.constexpr, BT: tl.constexpr, BA: tl.constexpr):
    """PHI (TT, ·, A) raw rates (sphi_h = 0 when shared by heads); DT (TT, H) fp32; TH (TT, H, A) fp32."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    t0 = tl.load(SEQ_START + s)
    t1 = tl.load(SEQ_END + s)
    aa = tl.arange(0, BA)
    am = aa < A
    if HAS_TH0:
        carry = tl.load(TH0 + (s * H + h) * A + aa, mask=am, other=0.0)
    else:
        carry = tl.zeros((BA,), dtype=tl.float32)
    for b0 in range(t0, t1, BT):
        tt = b0 + tl.arange(0, BT)
        tm = tt < t1
        m = tm[:, None] & am[None, :]
        phi = tl.load(PHI + tt.to(tl.int64)[:, None] * sphi_t + h * sphi_h + aa[None, :], mask=m, other=0.0)
        dt = tl.load(DT + tt.to(tl.int64) * H + h, mask=tm, other=0.0)
        inc = 3.141592653589793 * (2.0 * fast_sigmoid(2.0 * phi.to(tl.float32)) - 1.0) * dt[:, None]
        th = tl.cumsum(inc, axis=0) + carry[None, :]
        th = th - 6.283185307179586 * tl.floor(th * 0.15915494309189535)
        tl.store(TH + (tt.to(tl.int64)[:, None] * H + h) * A + aa[None, :], th, mask=m)
        carry = tl.sum(tl.where((tt == tl.minimum(b0 + BT, t1) - 1)[:, None], th, 0.0), axis=0)


@triton.jit
def mimo_angle_bwd_kernel(PHI, sphi_t, sphi_h, DT, DTH, DPHI, DDT, DTH0, SEQ_START, SEQ_END, H, A,
                          BT: tl.constexpr, BA: tl.constexpr):
    """DTH (TT, H, A) → DPHI (TT, H, A) per head, DDT (TT, H), DTH0 (NS, H, A)."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    t0 = tl.load(SEQ_START + s)
    t1 = tl.load(SEQ_END + s)
    aa = tl.arange(0, BA)
    am = aa < A
    carry = tl.zeros((BA,), dtype=tl.float32)
    nb = tl.cdiv(t1 - t0, BT)
    for i in range(0, nb):
        b0 = t0 + (nb - 1 - i) * BT
        tt = b0 + tl.arange(0, BT)
        tm = tt < t1
        m = tm[:, None] & am[None, :]
        d = tl.load(DTH + (tt.to(tl.int64)[:, None] * H + h) * A + aa[None, :], mask=m, other=0.0)
        g = tl.cumsum(d, axis=0, reverse=True) + carry[None, :]
        carry += tl.sum(d, axis=0)
        phi = tl.load(PHI + tt.to(tl.int64)[:, None] * sphi_t + h * sphi_h + aa[None, :], mask=m,
                      other=0.0).to(tl.float32)
        dt = tl.load(DT + tt.to(tl.int64) * H + h, mask=tm, other=0.0)
        th = 2.0 * fast_sigmoid(2.0 * phi) - 1.0
        tl.store(DPHI + (tt.to(tl.int64)[:, None] * H + h) * A + aa[None, :],
                 3.141592653589793 * (1.0 - th * th) * dt[:, None] * g, mask=m)
        tl.store(DDT + tt.to(tl.int64) * H + h, tl.sum(3.141592653589793 * th * g, axis=1), mask=tm)
    tl.store(DTH0 + (s * H + h) * A + aa, carry, mask=am)


def _meta(nangles):
    ba = max(16, triton.next_power_of_2(nangles))
    return dict(BT=max(16, min(128, 4096 // ba)), BA=ba)


class MimoAngles(torch.autograd.Function):
    """θ (TT, H, A) fp32 from angles (TT, H or 1, A), dt (TT, H) fp32 and θ_init (NS, H, A) or None."""

    @staticmethod
    def forward(ctx, phi, dt_tok, theta0, seq_start, seq_end):
        TT, H = dt_tok.shape
        A = phi.shape[-1]
        shared = phi.shape[1] == 1 and H > 1
        theta = torch.empty(TT, H, A, device=phi.device, dtype=torch.float32)
        ns = seq_start.numel()
        mimo_angle_fwd_kernel[(ns, H)](phi, phi.stride(0), 0 if shared else phi.stride(1), dt_tok,
                                       theta0 if theta0 is not None else theta, theta, seq_start, seq_end, H, A,
                                       HAS_TH0=theta0 is not None, **_meta(A), num_warps=4)
        ctx.save_for_backward(phi, dt_tok, seq_start, seq_end)
        ctx.shared = shared
        ctx.has_th0 = theta0 is not None
        return theta

    @staticmethod
    def backward(ctx, dtheta):
        phi, dt_tok, seq_start, seq_end = ctx.saved_tensors
        TT, H = dt_tok.shape
        A = phi.shape[-1]
        ns = seq_start.numel()
        dphi = torch.empty(TT, H, A, device=phi.device, dtype=torch.float32)
        ddt = torch.empty(TT, H, device=phi.device, dtype=torch.float32)
        dth0 = torch.empty(ns, H, A, device=phi.device, dtype=torch.float32)
        mimo_angle_bwd_kernel[(ns, H)](phi, phi.stride(0), 0 if ctx.shared else phi.stride(1), dt_tok,
                                       dtheta.contiguous(), dphi, ddt, dth0, seq_start, seq_end, H, A,
                                       **_meta(A), num_warps=4)
        if ctx.shared:
            dphi = dphi.sum(1, keepdim=True)
        return dphi.to(phi.dtype), ddt, dth0 if ctx.has_th0 else None, None, None
