"""Public MIMO Mamba-3 operator."""
from __future__ import annotations

import torch

from ...reference import mimo_chunked
from ..checks import check_common, check_mimo_params, check_states, choose_backend, expect_shape

REFERENCE_CHUNK_SIZE = 16


@torch.compiler.disable
def mamba3_mimo(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D=None, z=None,
                input_states=None, *, chunk_size=None, cu_seqlens=None, rms_norm=False, norm_weight=None,
                norm_eps=1e-5, return_final_states=False, backend="auto", precision="ieee", save_y=False):
    r"""MIMO Mamba-3: rank-R inputs and outputs per head around one (P×N) state.

    As :func:`mamba3.mamba3_siso`, with R query/key rows per token, half-split rotation pairs (n, n + N/2),
    n < A, and ṽ_{t,r} = v_t ⊙ mimo_v_r:

        h_t = α_t·h_{t−1} + (1−λ_t)·dt_t·α_t·Σ_r ṽ_{t−1,r}k̃_{t−1,r}ᵀ + λ_t·dt_t·Σ_r ṽ_{t,r}k̃_{t,r}ᵀ
        y_{t,r} = h_t q̃_{t,r} + D·ṽ_{t,r}
        out_t = Σ_r mimo_out_r ⊙ norm(y_{t,r}) ⊙ silu(z_t ⊙ mimo_z_r)

    Args:
        q, k: (B, T, R, G, N). v, z: (B, T, H, P). adt, dt, trap: (B, H, T). q_bias, k_bias: (H, R, N).
        mimo_v, mimo_z: (H, R, P). mimo_out: (H, R, P), or None to return the per-rank outputs
            (B, T, R, H, P) (gated, and normalised when rms_norm).
        angles: (B, T, H, A) or (B, T, A), A ≤ N/2 (the official layout has A = N / rotary_dim_divisor).
        D: (H,) or None.
        input_states: None or (angle (NS, H, A), ssm (NS, H, P, N), k (NS, R, H, N), v (NS, H, P)).
        rms_norm: RMS-normalise each y_{t,r} over P before the gate, times norm_weight (H, P) (None = ones),
            with norm_eps.
        chunk_size, cu_seqlens, return_final_states, backend, precision: as for SISO.
        save_y: (Triton backend) keep every y_{t,r} (B·T·R·H·P fp32) from the forward for the backward, which
            otherwise computes them again from the states: H100, bf16, B=8, T=4096, H=32, P=64, R=4, forward+
            backward 24.5 → 22.4 ms (forward 3.96 → 4.80), for 32 KiB more memory per token (1.07 GB there) held
            from the forward to the backward.
            The eager autograd path only: under torch.compile (the custom ops) y is computed again.

    Returns:
        out (B, T, H, P), or (B, T, R, H, P) when mimo_out is None, in v's dtype; with return_final_states,
        (out, (angle, ssm, k, v)), all differentiable.
    """
    expect_shape("q", q, (v.shape[0], v.shape[1], None, None, None))
    bsz, seqlen, nheads, headdim, dstate, nangles, nseq = check_common(
        "(B, T, R, G, N)", q, k, v, adt, dt, trap, angles, D, z, cu_seqlens, chunk_size, precision)
    rank = q.shape[2]
    norm_weight = check_mimo_params(q_bias, k_bias, mimo_v, mimo_z, mimo_out, rms_norm, norm_weight, nheads, rank,
                                    dstate, headdim)
    check_states(input_states, [(nseq, nheads, nangles), (nseq, nheads, headdim, dstate),
                                (nseq, rank, nheads, dstate), (nseq, nheads, headdim)])
    kernel = choose_backend("mimo", backend, (q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out,
                                              angles, D, z, norm_weight, input_states))
    if kernel is None:
        out, final_states = mimo_chunked(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles,
                                         D, z, input_states, chunk_size=chunk_size or REFERENCE_CHUNK_SIZE,
                                         cu_seqlens=cu_seqlens, rms_norm=rms_norm, norm_weight=norm_weight,
                                         norm_eps=norm_eps)
    else:
        out, final_states = kernel(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z,
                                   input_states, chunk_size, cu_seqlens, rms_norm, norm_weight, norm_eps, precision,
                                   save_y=save_y)
    return (out, final_states) if return_final_states else out
