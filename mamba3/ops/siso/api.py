"""Public SISO Mamba-3 operator."""
from __future__ import annotations

import torch

from ...reference import siso_chunked
from ..checks import check_common, check_states, choose_backend, expect_shape

REFERENCE_CHUNK_SIZE = 64


@torch.compiler.disable
def mamba3_siso(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D=None, z=None, input_states=None, *,
                chunk_size=None, cu_seqlens=None, return_final_states=False, backend="auto", precision="ieee",
                save_states=False):
    r"""SISO Mamba-3: a state-space layer with trapezoidal discretisation and data-dependent rotations.

    For each head, with λ_t = σ(trap_t), α_t = exp(adt_t), θ_t = (θ_init + Σ_{s≤t} π·tanh(angles_s)·dt_s) mod 2π,
    q̃_t = R(θ_t)(q_t + q_bias), k̃_t = R(θ_t)(k_t + k_bias) (adjacent pairs (2i, 2i+1), i < A):

        h_t = α_t·h_{t−1} + (1−λ_t)·dt_t·α_t·v_{t−1}k̃_{t−1}ᵀ + λ_t·dt_t·v_t k̃_tᵀ
        out_t = (h_t q̃_t + D·v_t) ⊙ silu(z_t)

    Args:
        q, k: (B, T, G, N) C and B projections; head h uses group h // (H/G). N even.
        v: (B, T, H, P) inputs. z: (B, T, H, P) gate or None. D: (H,) skip or None.
        adt: (B, H, T) log-decay A·dt (≤ 0). dt: (B, H, T) step sizes. trap: (B, H, T) trapezoid logits.
        q_bias, k_bias: (H, N).
        angles: (B, T, H, A) or, shared by all heads, (B, T, A) angle rates; A ≤ N/2.
        input_states: None or (angle (NS, H, A), ssm (NS, H, P, N), k (NS, H, N), v (NS, H, P)) — the final
            states of a previous call, to continue a sequence. NS = B, or the number of sequences in varlen.
        chunk_size: chunk length (power of two); None = the dispatcher's choice for the device.
        cu_seqlens: (NS + 1,) integer offsets of packed sequences (B must be 1), each of length ≥ 1; read on
            the host, so a CPU tensor saves a synchronisation with the device.
        return_final_states: also return (angle, ssm, k, v) after the last token of every sequence.
        backend: "auto" (Triton kernels on CUDA, the PyTorch reference elsewhere), "reference" or "triton".
        precision: "ieee" (fp32 inputs give fp32-accurate dots: tf32x3 on tensor cores or IEEE FMA, whichever
            the configuration chose) or "tf32" (opt-in, faster, ~1e-3 error).
        save_states: (Triton backend, 16-bit inputs) keep the state entering every chunk, which the forward
            stores in v's dtype for its output kernel, for the backward instead of computing it again: H·P·N/chunk
            values of v's dtype per token held from forward to backward (2× v's size at N = 128, chunk 64; 268 MB
            at B=8, T=4096, H=32, P=64) for a faster forward+backward (H100, bf16, that shape: 6.30 → 5.71 ms; B=1,
            T=32768: 7.41 → 6.52). The decay gradient's ⟨dS, S⟩ term then reads those 16-bit states, as the other
            gradients' dots do anyway. Ignored for fp32 inputs and by the reference backend.

    Returns:
        out (B, T, H, P) in v's dtype; with return_final_states, (out, (angle, ssm, k, v)). Angle, ssm and k
        states are fp32 (fp64 for fp64 inputs); v has v's dtype. Everything is differentiable.
    """
    expect_shape("q", q, (v.shape[0], v.shape[1], None, None))
    bsz, seqlen, nheads, headdim, dstate, nangles, nseq = check_common(
        "(B, T, G, N)", q, k, v, adt, dt, trap, angles, D, z, cu_seqlens, chunk_size, precision)
    expect_shape("q_bias", q_bias, (nheads, dstate))
    expect_shape("k_bias", k_bias, (nheads, dstate))
    check_states(input_states, [(nseq, nheads, nangles), (nseq, nheads, headdim, dstate), (nseq, nheads, dstate),
                                (nseq, nheads, headdim)])
    kernel = choose_backend("siso", backend, (q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states))
    if kernel is None:
        out, final_states = siso_chunked(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states,
                                         chunk_size=chunk_size or REFERENCE_CHUNK_SIZE, cu_seqlens=cu_seqlens)
    else:
        out, final_states = kernel(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states, chunk_size,
                                   cu_seqlens, precision, final_states=return_final_states, save_states=save_states)
    return (out, final_states) if return_final_states else out
