"""Public MIMO Mamba-3 operator."""
from __future__ import annotations

import torch

from ...reference import mimo_chunked
from ..checks import check_common, check_states, choose_backend, expect_shape

REFERENCE_CHUNK_SIZE = 16


@torch.compiler.disable
def mamba3_mimo(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D=None, z=None,
                input_states=None, *, chunk_size=None, cu_seqlens=None, rms_norm=False, norm_weight=None,
                norm_eps=1e-5, return_final_states=False, backend="auto", precision="ieee"):
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

    Returns:
        out (B, T, H, P), or (B, T, R, H, P) when mimo_out is None, in v's dtype; with return_final_states,
        (out, (angle, ssm, k, v)), all differentiable.
    """
    bsz, seqlen, nheads, headdim, nangles, nseq = check_common(
        "(B, T, R, G, N)", q, k, v, adt, dt, trap, angles, D, z, cu_seqlens, chunk_size, backend, precision,
        q.shape[-1])
    expect_shape("q", q, (bsz, seqlen, None, None, None))
    rank, dstate = q.shape[2], q.shape[-1]
    for name, x, last in (("q_bias", q_bias, dstate), ("k_bias", k_bias, dstate), ("mimo_v", mimo_v, headdim),
                          ("mimo_z", mimo_z, headdim), ("mimo_out", mimo_out, headdim)):
        if x is not None or name != "mimo_out":
            expect_shape(name, x, (nheads, rank, last))
    if norm_weight is not None:
        if not rms_norm:
            raise ValueError("norm_weight is given but rms_norm=False")
        norm_weight = norm_weight.reshape(nheads, headdim) if norm_weight.numel() == nheads * headdim else norm_weight
        expect_shape("norm_weight", norm_weight, (nheads, headdim))
    check_states(input_states, [(nseq, nheads, nangles), (nseq, nheads, headdim, dstate),
                                (nseq, rank, nheads, dstate), (nseq, nheads, headdim)])
    kernel = choose_backend("mimo", backend, v.device)
    if kernel is None:
        out, final_states = mimo_chunked(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles,
                                         D, z, input_states, chunk_size=chunk_size or REFERENCE_CHUNK_SIZE,
                                         cu_seqlens=cu_seqlens, rms_norm=rms_norm, norm_weight=norm_weight,
                                         norm_eps=norm_eps)
    else:
        out, final_states = kernel(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z,
                                   input_states, chunk_size, cu_seqlens, rms_norm, norm_weight, norm_eps, precision)
    return (out, final_states) if return_final_states else out
