"""The official Mamba-3 function names and signatures (``mamba_ssm``), on top of mamba3's operators.

Switching is one import: ``from mamba3.compat import mamba3_siso_combined, mamba3_mimo``. Layouts, rotation
conventions and returned tuples are the official ones. Differences, all deliberate:
- fp32 inputs are computed and returned in fp32 (the official SISO function casts to bf16);
- MIMO accepts input states and its final states are differentiable;
- any T ≥ 1 works, forward and backward.
"""
from __future__ import annotations

from .ops.mimo.api import mamba3_mimo as _mimo
from .ops.siso.api import mamba3_siso as _siso


def mamba3_siso_combined(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, Input_States=None,
                         chunk_size=64, return_final_states=False, cu_seqlens=None):
    """Official ``mamba3_siso_combined``. Returns out, or (out, angle, ssm, k, v) with return_final_states."""
    result = _siso(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States, chunk_size=chunk_size,
                   cu_seqlens=cu_seqlens, return_final_states=return_final_states)
    if return_final_states:
        out, states = result
        return (out, *states)
    return result


def mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z, chunk_size,
                rotary_dim_divisor, dtype, return_state=False, cu_seqlens=None, fuse_pregate_headwise_rms_norm=False,
                outproj_norm_weight=None, outproj_norm_eps=1e-5, Input_States=None):
    """Official ``mamba3_mimo``: Angles (B, T, H, N / rotary_dim_divisor), ``dtype`` the compute dtype of
    Q, K, V, Z and Trap. Returns out, or (out, angle, ssm, k, v) with return_state. ``Input_States``
    (angle, ssm, k, v) is an extension: the official function cannot continue a sequence."""
    dstate = Q.shape[-1]
    if rotary_dim_divisor not in (2, 4):
        raise ValueError(f"rotary_dim_divisor must be 2 or 4, got {rotary_dim_divisor}")
    if Angles.shape[-1] != dstate // rotary_dim_divisor:
        raise ValueError(f"Angles must have N / rotary_dim_divisor = {dstate // rotary_dim_divisor} angles per "
                         f"token, got {Angles.shape[-1]}")
    if dtype is not None:
        Q, K, V, Trap = (x.to(dtype) for x in (Q, K, V, Trap))
        Z = None if Z is None else Z.to(dtype)
    result = _mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z, Input_States,
                   chunk_size=chunk_size, cu_seqlens=cu_seqlens, rms_norm=fuse_pregate_headwise_rms_norm,
                   norm_weight=outproj_norm_weight if fuse_pregate_headwise_rms_norm else None,
                   norm_eps=outproj_norm_eps, return_final_states=return_state)
    if return_state:
        out, states = result
        return (out, *states)
    return result


__all__ = ["mamba3_siso_combined", "mamba3_mimo"]
