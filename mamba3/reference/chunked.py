"""Mamba-3 in chunked (parallel) form: the same math as :mod:`.recurrent`, organised like the kernels.

Per chunk of C tokens with in-chunk log-decay cumsum cs_i = Σ_{r≤i} a_r and incoming state S:

    y_{i,r} = e^{cs_i}·S q̃_{i,r}                                           (inter-chunk)
            + Σ_{j<i} e^{cs_i − cs_j}·scale_j·Σ_{r'} (q̃_{i,r}·k̃_{j,r'}) ṽ_{j,r'}   (strictly causal)
            + γ_i·Σ_{r'} (q̃_{i,r}·k̃_{i,r'}) ṽ_{i,r'}                             (same token)
    S ← e^{cs_last}·S + Σ_j e^{cs_last − cs_j}·scale_j·Σ_r ṽ_{j,r} k̃_{j,r}ᵀ

with scale_j = γ_j + (1 − λ_{j+1})·dt_{j+1} (the weight token j gets now and at the next step) and the input
states folded in as S_0 = SSM_in + (1 − λ_0)·dt_0·Σ_r ṽ_in,r k̃_inᵀ. Differentiable by autograd in any dtype;
this is the package's CPU backend.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import run_mimo, run_siso


def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(B, T, R, H, D) → (B, H, nchunks, C, R, D), zero-padded at the end."""
    bsz, seqlen, rank, nheads, dim = x.shape
    pad = -seqlen % chunk_size
    x = F.pad(x, (0, 0, 0, 0, 0, 0, 0, pad))
    return x.permute(0, 3, 1, 2, 4).reshape(bsz, nheads, -1, chunk_size, rank, dim)


def _chunked_core(q_rot, k_rot, v_rank, adt, gamma, beta_nodecay, scale, ssm_in, k_in, v_in_rank, chunk_size):
    bsz, seqlen, rank, nheads, dstate = k_rot.shape
    headdim = v_rank.shape[-1]
    pad = -seqlen % chunk_size
    q, k, v = (_to_chunks(x, chunk_size) for x in (q_rot, k_rot, v_rank))          # (B, H, c, C, R, ·)
    a, gamma, scale = (F.pad(x, (0, pad)).unflatten(-1, (-1, chunk_size)) for x in (adt, gamma, scale))

    cs = torch.cumsum(a, dim=-1)                                                    # (B, H, c, C)
    strictly_causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=a.device).tril(-1)
    decay = torch.exp((cs[..., :, None] - cs[..., None, :]).masked_fill(~strictly_causal, float("-inf")))
    scores = torch.einsum("bhcird,bhcjsd->bhcirjs", q, k)
    y = torch.einsum("bhcirjs,bhcij,bhcjsp->bhcirp", scores, decay * scale[..., None, :], v)
    same_token = torch.einsum("bhcird,bhcisd->bhcirs", q, k)
    y = y + gamma[..., None, None] * torch.einsum("bhcirs,bhcisp->bhcirp", same_token, v)

    to_end = torch.exp(cs[..., -1:] - cs) * scale                                   # (B, H, c, C)
    local_states = torch.einsum("bhcj,bhcjsp,bhcjsn->bhcpn", to_end, v, k)
    chunk_decay = torch.exp(cs[..., -1])                                            # (B, H, c)

    state = q.new_zeros(bsz, nheads, headdim, dstate) if ssm_in is None else ssm_in
    if k_in is not None:
        state = state + beta_nodecay[:, :, 0, None, None] * torch.einsum("brhp,brhn->bhpn", v_in_rank, k_in)
    incoming = []
    for c in range(local_states.shape[2]):
        incoming.append(state)
        state = chunk_decay[:, :, c, None, None] * state + local_states[:, :, c]
    incoming = torch.stack(incoming, dim=2)                                         # (B, H, c, P, N)
    y = y + torch.exp(cs)[..., None, None] * torch.einsum("bhcpn,bhcirn->bhcirp", incoming, q)

    y = y.reshape(bsz, nheads, -1, rank, headdim)[:, :, :seqlen].permute(0, 2, 3, 1, 4)
    return y, state


def siso_chunked(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D=None, z=None, input_states=None,
                 chunk_size=64, cu_seqlens=None):
    """SISO Mamba-3 in chunked form. Arguments and returns as :func:`mamba3.mamba3_siso`."""
    return run_siso(_chunked_core, q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states,
                    cu_seqlens, chunk_size=chunk_size)


def mimo_chunked(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D=None, z=None,
                 input_states=None, chunk_size=16, cu_seqlens=None, rms_norm=False, norm_weight=None,
                 norm_eps=1e-5):
    """MIMO Mamba-3 in chunked form. Arguments and returns as :func:`mamba3.mamba3_mimo`."""
    return run_mimo(_chunked_core, q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles,
                    D, z, input_states, cu_seqlens, rms_norm, norm_weight, norm_eps, chunk_size=chunk_size)
