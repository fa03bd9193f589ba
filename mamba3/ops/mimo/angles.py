"""Angle cumsum for the MIMO kernels, θ_t = (θ_init + Σ_{s≤t} π·tanh(φ_s)·dt_s) mod 2π in fp32, and its backward:
an autograd Function over the chunk-parallel kernels of ``mamba3.ops.common.cumsum`` (the same ones SISO uses).

Forward (``common.cumsum.angle_cumsum``): per (64-token chunk, head) the sum of the increments, a float64 prefix
over the wrapped chunk sums (so the rounding never grows with T), then per chunk the running sum inside the chunk.
Backward (``common.cumsum.angle_backward``): G_s = Σ_{t≥s} dθ_t (the final angle's gradient arrives through θ of
the last token), dφ = π·(1 − tanh²φ)·dt·G (summed over heads when the angles are shared), ddt = Σ_a π·tanh(φ)·G,
dθ_init = G_0. The mod is the identity for gradients.

Every step runs over (chunk, head) in parallel: a (sequence, head) walk was 0.73 + 1.11 ms of the forward and
backward at B=1, T=32768, H=32 on the H200 (32 programs), against 0.13 + 0.19 ms at B=8, T=4096.
"""
from __future__ import annotations

import torch

from ..common.chunking import Chunks
from ..common.cumsum import angle_backward, angle_cumsum

#: tokens per chunk of the angle sums (independent of the MIMO kernels' tiles)
ANGLE_CHUNK = 64


class MimoAngles(torch.autograd.Function):
    """θ (B, T, H, A) fp32 in [0, 2π) from angles (B, T, H, A) or shared (B, T, A) (contiguous), dt (B, H, T) fp32
    contiguous, θ_init (NS, H, A) fp32 or None, and the chunk table of ``ANGLE_CHUNK``-token chunks."""

    @staticmethod
    def forward(ctx, angles, dt, theta0, chunks: Chunks, nheads: int):
        ctx.save_for_backward(angles, dt, theta0)
        ctx.chunks, ctx.nheads = chunks, nheads
        if angles.shape[-1] == 0:  # no rotation
            return dt.new_zeros(dt.shape[0], dt.shape[-1], nheads, 0)
        theta, _ = angle_cumsum(angles, dt, chunks, nheads, angles.shape[-1], theta0)
        return theta

    @staticmethod
    def backward(ctx, dtheta):
        angles, dt, theta0 = ctx.saved_tensors
        if angles.shape[-1] == 0:
            return (torch.zeros_like(angles), torch.zeros_like(dt),
                    None if theta0 is None else torch.zeros_like(theta0), None, None)
        dang, ddt, dth0 = angle_backward(dtheta.contiguous(), None, angles, dt, ctx.chunks, ctx.nheads,
                                         angles.shape[-1])
        return dang.to(angles.dtype), ddt, None if theta0 is None else dth0.to(theta0.dtype), None, None


def aot_angle_launches(nheads: int, nangles: int):
    """The launches of a forward and backward of :class:`MimoAngles` (per-head angles, input angle state), recorded
    on small CPU tensors for the AOT lane, named ``mimo_angle_<kernel>-A<nangles>``."""
    from mamba3.testing.aot import KernelLaunch

    from ..common.chunking import make_chunks
    from ..common.launch import recording

    bsz, seqlen = 2, 256
    chunks = make_chunks(bsz, seqlen, ANGLE_CHUNK, None, "cpu")
    angles = torch.zeros(bsz, seqlen, nheads, nangles)
    dt = torch.zeros(bsz, nheads, seqlen)
    with recording() as rec:
        angle_cumsum(angles, dt, chunks, nheads, nangles, torch.zeros(bsz, nheads, nangles))
        angle_backward(torch.zeros(bsz, seqlen, nheads, nangles), None, angles, dt, chunks, nheads, nangles)
    return [KernelLaunch(f"mimo_angle_{kernel.fn.__name__}-A{nangles}", kernel, tuple(args), dict(meta))
            for kernel, _grid, args, meta in rec]
