"""Public decode-step functions: validation, backend choice, and the ``mamba3::step`` torch custom op.

The custom op (with a fake implementation) lets ``torch.compile(fullgraph=True)`` trace a model's decode step
and lets CUDA graphs capture it: validation here only reads shapes, dtypes and devices (no host sync), and
the Triton launch allocates only the output.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..checks import check_heads, check_mimo_params, check_token_inputs, expect_shape, use_triton
from .reference import step_reference


@torch.library.custom_op("mamba3::step", mutates_args=("angle_state", "ssm_state", "k_state", "v_state"))
def _step_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, adt: torch.Tensor, dt: torch.Tensor,
             trap: torch.Tensor, q_bias: torch.Tensor, k_bias: torch.Tensor, mimo_v: Optional[torch.Tensor],
             mimo_z: Optional[torch.Tensor], mimo_out: Optional[torch.Tensor], angles: torch.Tensor,
             D: Optional[torch.Tensor], z: Optional[torch.Tensor], angle_state: torch.Tensor,
             ssm_state: torch.Tensor, k_state: torch.Tensor, v_state: torch.Tensor,
             state_batch_indices: Optional[torch.Tensor], rms_norm: bool, norm_weight: Optional[torch.Tensor],
             norm_eps: float, siso: bool, use_triton: bool) -> torch.Tensor:
    args = (q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, angle_state,
            ssm_state, k_state, v_state, state_batch_indices, rms_norm, norm_weight, norm_eps)
    if use_triton:
        from .launch import step_triton

        return step_triton(*args, siso=siso)
    return step_reference(*args, pairing="adjacent" if siso else "half", siso=siso)


@_step_op.register_fake
def _(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, angle_state, ssm_state,
      k_state, v_state, state_batch_indices, rms_norm, norm_weight, norm_eps, siso, use_triton):
    bsz, nheads, headdim = v.shape
    if not siso and mimo_out is None:
        return v.new_empty(bsz, q.shape[1], nheads, headdim)
    return v.new_empty(bsz, nheads, headdim)


def _check(q, v, adt, dt, trap, angles, D, z, states, sbi, rank):
    expect_shape("v", v, (None, None, None))
    bsz, nheads, headdim = v.shape
    _, dstate = check_heads(q, nheads)
    nangles = check_token_inputs(adt, dt, trap, angles, D, z, (bsz,), nheads, headdim, dstate)
    if not isinstance(states, (tuple, list)) or len(states) != 4:
        raise ValueError("states must be a tuple (angle, ssm, k, v) of 4 tensors (updated in place)")
    angle_s, ssm_s, k_s, v_s = states
    nslots = ssm_s.shape[0] if isinstance(ssm_s, torch.Tensor) and ssm_s.dim() == 4 else None
    if sbi is None and nslots != bsz:
        raise ValueError(f"states have {nslots} rows but the batch has {bsz}; pass state_batch_indices to address "
                         "a larger state pool")
    k_shape = (nslots, nheads, dstate) if rank is None else (nslots, rank, nheads, dstate)
    for name, x, shape in (("angle", angle_s, (nslots, nheads, nangles)), ("ssm", ssm_s, (nslots, nheads, headdim,
                           dstate)), ("k", k_s, k_shape), ("v", v_s, (nslots, nheads, headdim))):
        expect_shape(f"states {name}", x, shape)
    if angle_s.dtype not in (torch.float32, torch.float64) or ssm_s.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"the angle and ssm states must be fp32 (or fp64), got {angle_s.dtype} and {ssm_s.dtype}")
    if sbi is not None:
        if not isinstance(sbi, torch.Tensor) or sbi.shape != (bsz,) or sbi.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"state_batch_indices must be an int32/int64 tensor of shape ({bsz},), got "
                             f"{getattr(sbi, 'dtype', type(sbi))} {tuple(getattr(sbi, 'shape', ()))}")
    return bsz, nheads, headdim, dstate


def mamba3_siso_step(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, states, *, state_batch_indices=None,
                     backend="auto"):
    r"""One decode step of SISO Mamba-3 for every row of a batch; the states are updated in place.

    Same math as :func:`mamba3.mamba3_siso` for a single token continuing from ``states``:
    θ' = (θ + π·tanh(angles)·dt) mod 2π, q̃ = R(θ')(q + q_bias), k̃ = R(θ')(k + k_bias) (adjacent pairs),
    h' = e^{adt}·h + (1−λ)·dt·e^{adt}·v_prev k̃_prevᵀ + λ·dt·v k̃ᵀ, out = (h' q̃ + D·v) ⊙ silu(z).

    Args:
        q, k: (B, G, N). v, z: (B, H, P) (z may be None). adt, dt, trap: (B, H) (trap pre-sigmoid).
        q_bias, k_bias: (H, N). angles: (B, H, A) or shared across heads (B, A). D: (H,) or None.
        states: (angle (S, H, A) fp32, ssm (S, H, P, N) fp32, k (S, H, N), v (S, H, P)), the final states of
            :func:`mamba3.mamba3_siso` (or zeros); written in place with the new θ' (in [0, 2π)), h', k̃, v.
        state_batch_indices: None (S = B, row b uses state row b) or (B,) int32/int64: row b uses state row
            state_batch_indices[b] of a larger pool; a negative index skips the row (output zeros).
        backend: "auto" (Triton on CUDA, the PyTorch reference elsewhere or for float64), "reference", "triton".

    Returns:
        out (B, H, P) in v's dtype. CUDA-graph capturable with the Triton backend.
    """
    expect_shape("q", q, (v.shape[0], None, None))
    expect_shape("k", k, tuple(q.shape))
    _, nheads, _, dstate = _check(q, v, adt, dt, trap, angles, D, z, states, state_batch_indices, None)
    expect_shape("q_bias", q_bias, (nheads, dstate))
    expect_shape("k_bias", k_bias, (nheads, dstate))
    run_triton = use_triton(backend, (q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, *states,
                                       state_batch_indices))
    angle_s, ssm_s, k_s, v_s = states
    return _step_op(q[:, None], k[:, None], v, adt, dt, trap, q_bias[:, None], k_bias[:, None], None, None, None,
                    angles, D, z, angle_s, ssm_s, k_s[:, None], v_s, state_batch_indices, False, None, 1e-5,
                    True, run_triton)


def mamba3_mimo_step(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, states, *,
                     rms_norm=False, norm_weight=None, norm_eps=1e-5, state_batch_indices=None, backend="auto"):
    r"""One decode step of MIMO Mamba-3 for every row of a batch; the states are updated in place.

    Same math as :func:`mamba3.mamba3_mimo` for a single token (half-split rotation, ṽ_r = v ⊙ mimo_v_r):
    h' = e^{adt}·h + (1−λ)·dt·e^{adt}·Σ_r ṽ_prev,r k̃_prev,rᵀ + λ·dt·Σ_r ṽ_r k̃_rᵀ, y_r = h' q̃_r + D·ṽ_r,
    out = Σ_r mimo_out_r ⊙ norm(y_r) ⊙ silu(z ⊙ mimo_z_r).

    Args:
        q, k: (B, R, G, N). v, z: (B, H, P). adt, dt, trap: (B, H). q_bias, k_bias: (H, R, N).
        mimo_v, mimo_z: (H, R, P). mimo_out: (H, R, P) or None (per-rank output (B, R, H, P)).
        angles: (B, H, A) or (B, A). D: (H,) or None.
        states: (angle (S, H, A) fp32, ssm (S, H, P, N) fp32, k (S, R, H, N), v (S, H, P)), updated in place.
        rms_norm, norm_weight (H, P) or (H·P,), norm_eps: as :func:`mamba3.mamba3_mimo`.
        state_batch_indices, backend: as :func:`mamba3_siso_step`.

    Returns:
        out (B, H, P), or (B, R, H, P) when mimo_out is None, in v's dtype.
    """
    expect_shape("q", q, (v.shape[0], None, None, None))
    expect_shape("k", k, tuple(q.shape))
    rank = q.shape[1]
    _, nheads, headdim, dstate = _check(q, v, adt, dt, trap, angles, D, z, states, state_batch_indices, rank)
    norm_weight = check_mimo_params(q_bias, k_bias, mimo_v, mimo_z, mimo_out, rms_norm, norm_weight, nheads, rank,
                                    dstate, headdim)
    run_triton = use_triton(backend, (q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles,
                                       D, z, *states, state_batch_indices))
    angle_s, ssm_s, k_s, v_s = states
    return _step_op(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, angle_s,
                    ssm_s, k_s, v_s, state_batch_indices, bool(rms_norm), norm_weight, float(norm_eps), False,
                    run_triton)
