"""The one-token decode step in plain PyTorch: the recurrence of :mod:`mamba3.reference.recurrent` for one token.

Layout (rank-expanded; SISO is R = 1 with adjacent-pair rotation):
    q, k (B, R, G, N); v, z (B, H, P); adt, dt, trap (B, H); q_bias, k_bias (H, R, N);
    mimo_v, mimo_z, mimo_out (H, R, P) or None; angles (B, H, A) or shared (B, A); D (H,) or None;
    states angle (S, H, A), ssm (S, H, P, N), k (S, R, H, N), v (S, H, P), updated in place.
Row b reads and writes state row ``state_batch_indices[b]`` (b when None); a negative index skips the row
(its output is zero and no state is touched).

    θ' = (θ + π·tanh(φ)·dt) mod 2π,  q̃_r = R(θ')(q_r + b_q,r),  k̃_r = R(θ')(k_r + b_k,r)
    h' = e^{a}·h + (1−λ)·dt·e^{a}·Σ_r ṽ_prev,r k̃_prev,rᵀ + λ·dt·Σ_r ṽ_r k̃_rᵀ,   ṽ_r = v ⊙ ψ_r
    y_r = h' q̃_r + D·ṽ_r, then the output stage (gate, optional RMSNorm, contraction with mimo_out).
"""
from __future__ import annotations

import math

import torch

from ...reference.common import TWO_PI, compute_dtype, expand_groups, mimo_output, rotate, siso_output


def wrap_angle(theta: torch.Tensor) -> torch.Tensor:
    """θ mod 2π, guaranteed in [0, 2π) after rounding."""
    theta = torch.remainder(theta, TWO_PI)
    return torch.where(theta >= TWO_PI, theta - TWO_PI, theta)


def step_reference(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z,
                   angle_state, ssm_state, k_state, v_state, state_batch_indices=None, rms_norm=False,
                   norm_weight=None, norm_eps=1e-5, pairing="half", siso=False):
    """One decode step (see the module docstring). Returns the output; the states are updated in place.

    Output: (B, H, P), or (B, R, H, P) for MIMO with mimo_out None, in v's dtype.
    """
    dtype = compute_dtype(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, angles, D, z, ssm_state)
    nheads = v.shape[1]
    if state_batch_indices is None:
        rows = None
        theta0, h0, k0, v0 = angle_state, ssm_state, k_state, v_state
    else:
        idx = state_batch_indices.long()
        valid = idx >= 0
        rows = idx.clamp(min=0)
        theta0, h0, k0, v0 = (s.index_select(0, rows) for s in (angle_state, ssm_state, k_state, v_state))

    phi = angles.to(dtype)
    if phi.dim() == 2:                                    # shared across heads
        phi = phi[:, None, :]
    theta = wrap_angle(theta0.to(dtype) + math.pi * torch.tanh(phi) * dt.to(dtype)[..., None])   # (B, H, A)
    qh = expand_groups(q.to(dtype), nheads, dim=2) + q_bias.to(dtype).transpose(0, 1)             # (B, R, H, N)
    kh = expand_groups(k.to(dtype), nheads, dim=2) + k_bias.to(dtype).transpose(0, 1)
    q_rot = rotate(qh, theta[:, None], pairing)
    k_rot = rotate(kh, theta[:, None], pairing)

    alpha = torch.exp(adt.to(dtype))
    lam = torch.sigmoid(trap.to(dtype))
    gamma = (lam * dt.to(dtype))[..., None, None]
    beta = ((1.0 - lam) * dt.to(dtype) * alpha)[..., None, None]
    psi = 1.0 if mimo_v is None else mimo_v.to(dtype).transpose(0, 1)                          # (R, H, P)
    v_rank = v.to(dtype)[:, None] * psi
    vprev_rank = v0.to(dtype)[:, None] * psi
    if v_rank.shape[1] != q_rot.shape[1]:                 # SISO: ψ = 1 keeps rank 1
        v_rank = v_rank.expand(-1, q_rot.shape[1], -1, -1)
        vprev_rank = vprev_rank.expand(-1, q_rot.shape[1], -1, -1)
    h = (alpha[..., None, None] * h0.to(dtype)
         + beta * torch.einsum("brhp,brhn->bhpn", vprev_rank, k0.to(dtype))
         + gamma * torch.einsum("brhp,brhn->bhpn", v_rank, k_rot))
    y = torch.einsum("bhpn,brhn->brhp", h, q_rot)
    if D is not None:
        y = y + D.to(dtype)[:, None] * v_rank
    if siso:
        out = siso_output(y[:, 0], z)
    else:
        out = mimo_output(y[:, None], None if z is None else z[:, None], mimo_z, mimo_out, rms_norm, norm_weight,
                          norm_eps)[:, 0]
    out = out.to(v.dtype)

    new = (theta, h, k_rot, v)
    states = (angle_state, ssm_state, k_state, v_state)
    with torch.no_grad():
        if rows is None:
            for s, x in zip(states, new):
                s.copy_(x)
        else:
            keep = rows[valid]                            # (host sync: the reference is not graph-capturable)
            for s, x in zip(states, new):
                s.index_copy_(0, keep, x[valid].to(s.dtype))
            out = torch.where(valid.view(-1, *([1] * (out.dim() - 1))), out, torch.zeros_like(out))
    return out
