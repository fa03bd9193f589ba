"""The definition of Mamba-3: the recurrence evaluated token by token.

    h_t = α_t·h_{t−1} + β_t·Σ_r ṽ_{t−1,r} k̃_{t−1,r}ᵀ + γ_t·Σ_r ṽ_{t,r} k̃_{t,r}ᵀ      (h ∈ ℝ^{P×N})
    y_{t,r} = h_t q̃_{t,r} + D·ṽ_{t,r}

with α_t = exp(a_t), β_t = (1 − λ_t)·dt_t·α_t, γ_t = λ_t·dt_t, λ_t = σ(trap_t); q̃, k̃ the biased q, k rotated
by θ_t; ṽ_{t,r} = v_t ⊙ ψ_r (MIMO; SISO is R = 1, ψ = 1). Before the first token, (h, k̃, v) are the input
states (zeros when absent). Slow and obviously right: the chunked form and every kernel are tested against it.
"""
from __future__ import annotations

import torch

from .common import run_mimo, run_siso


def _recurrent_core(q_rot, k_rot, v_rank, adt, gamma, beta_nodecay, scale, ssm_in, k_in, v_in_rank):
    # q_rot, k_rot (B, T, R, H, N); v_rank (B, T, R, H, P); adt, gamma, beta_nodecay (B, H, T)
    bsz, seqlen, _, nheads, dstate = k_rot.shape
    headdim = v_rank.shape[-1]
    h = q_rot.new_zeros(bsz, nheads, headdim, dstate) if ssm_in is None else ssm_in
    k_prev, v_prev = k_in, v_in_rank                     # (B, R, H, N), (B, R, H, P)
    ys = []
    for t in range(seqlen):
        alpha = torch.exp(adt[:, :, t])[..., None, None]
        h = alpha * h + gamma[:, :, t, None, None] * torch.einsum("brhp,brhn->bhpn", v_rank[:, t], k_rot[:, t])
        if k_prev is not None:
            beta = (beta_nodecay[:, :, t, None, None] * alpha)
            h = h + beta * torch.einsum("brhp,brhn->bhpn", v_prev, k_prev)
        ys.append(torch.einsum("bhpn,brhn->brhp", h, q_rot[:, t]))
        k_prev, v_prev = k_rot[:, t], v_rank[:, t]
    return torch.stack(ys, dim=1), h


def siso_recurrent(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D=None, z=None, input_states=None,
                   cu_seqlens=None):
    """SISO Mamba-3, token by token. Arguments and returns as :func:`mamba3.mamba3_siso`."""
    return run_siso(_recurrent_core, q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states,
                    cu_seqlens)


def mimo_recurrent(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D=None, z=None,
                   input_states=None, cu_seqlens=None, rms_norm=False, norm_weight=None, norm_eps=1e-5):
    """MIMO Mamba-3, token by token. Arguments and returns as :func:`mamba3.mamba3_mimo`."""
    return run_mimo(_recurrent_core, q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles,
                    D, z, input_states, cu_seqlens, rms_norm, norm_weight, norm_eps)
