"""Pieces shared by the recurrent and the chunked reference: dtypes, angles, rotations, trapezoid weights,
and the MIMO output stage. Everything here is plain PyTorch and differentiable.

Notation follows ``docs/ARCHITECTURE.md``: q/k are the C/B projections, v the x projection, ``adt`` the
log-decay a_t = A_t·dt_t (≤ 0), ``trap`` the pre-sigmoid trapezoid logit, ``angles`` the raw angle rates φ.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

TWO_PI = 2.0 * math.pi


def compute_dtype(*tensors) -> torch.dtype:
    """float64 if any floating input is float64, else float32: the precision of angles, decays and states."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
            return torch.float64
        if isinstance(t, (tuple, list)) and compute_dtype(*t) == torch.float64:
            return torch.float64
    return torch.float32


def expand_groups(x: torch.Tensor, nheads: int, dim: int) -> torch.Tensor:
    """(…, G, …) → (…, H, …) along ``dim``: head h reads q/k group h // (H / G)."""
    return x.repeat_interleave(nheads // x.shape[dim], dim=dim)


def angle_cumsum(angles: torch.Tensor, dt: torch.Tensor, angle_state: torch.Tensor | None,
                 dtype: torch.dtype) -> torch.Tensor:
    """θ_t = (θ_init + Σ_{s≤t} π·tanh(φ_s)·dt_s) mod 2π for every head.

    angles (B, T, H, A) or shared across heads (B, T, A); dt (B, H, T); angle_state (B, H, A) or None.
    Returns θ (B, T, H, A) in ``dtype``. The running sum is accumulated in float64 whatever ``dtype`` is, so
    the angle's precision does not degrade with the sequence length.
    """
    phi = angles.to(torch.float64)
    if phi.dim() == 3:                                  # shared across heads: broadcast, never expanded
        phi = phi[:, :, None, :]
    rate = math.pi * torch.tanh(phi) * dt.to(torch.float64).transpose(1, 2)[..., None]
    theta = torch.cumsum(rate, dim=1)
    if angle_state is not None:
        theta = theta + angle_state.to(torch.float64)[:, None]
    return torch.remainder(theta, TWO_PI).to(dtype)


def rotate(x: torch.Tensor, theta: torch.Tensor, pairing: str) -> torch.Tensor:
    """Rotate the first A pairs of x (…, N) by θ (…, A); the remaining dims pass through.

    pairing="adjacent" (SISO): pair i is (x[2i], x[2i+1]).
    pairing="half" (MIMO):     pair n is (x[n], x[n + N/2]).
    """
    n, a = x.shape[-1], theta.shape[-1]
    cos, sin = torch.cos(theta), torch.sin(theta)
    if pairing == "adjacent":
        pairs = x[..., : 2 * a].unflatten(-1, (a, 2))
        x0, x1 = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
        return torch.cat((rotated, x[..., 2 * a:]), dim=-1)
    if pairing == "half":
        half = n // 2
        x0, x1 = x[..., :a], x[..., half: half + a]
        return torch.cat((x0 * cos - x1 * sin, x[..., a:half], x0 * sin + x1 * cos, x[..., half + a:]), dim=-1)
    raise ValueError(f"unknown pairing {pairing!r}")


def trapezoid_weights(dt: torch.Tensor, trap: torch.Tensor, dtype: torch.dtype):
    """Exponential-trapezoid weights, all (B, H, T) in ``dtype``.

    γ_t = λ_t·dt_t weighs the input of step t at step t; (1 − λ_t)·dt_t weighs the input of step t−1 at step
    t ("beta" without its decay). ``scale`` is what the chunked form multiplies k̃_s by: γ_s plus the weight
    the next step gives it (zero after the last token).
    """
    dt = dt.to(dtype)
    lam = torch.sigmoid(trap.to(dtype))
    gamma = lam * dt
    beta_nodecay = (1.0 - lam) * dt
    shifted = F.pad(beta_nodecay[..., 1:], (0, 1))
    return gamma, beta_nodecay, gamma + shifted


def mimo_output(y: torch.Tensor, z, mimo_z, mimo_out, rms_norm: bool, norm_weight, norm_eps: float):
    """MIMO output stage. y (B, T, R, H, P) → out (B, T, H, P), or (B, T, R, H, P) when mimo_out is None.

    Optional headwise RMSNorm over P of each y_{t,r} (weight (H, P)), then the gate silu(z_t ⊙ ζ_r), then the
    contraction Σ_r φ_r ⊙ (…).
    """
    if rms_norm:
        y = y * torch.rsqrt(y.square().mean(dim=-1, keepdim=True) + norm_eps)
        if norm_weight is not None:
            y = y * norm_weight.to(y.dtype).reshape(y.shape[-2:])
    if z is not None:
        zr = z.to(y.dtype)[:, :, None] * mimo_z.to(y.dtype).transpose(0, 1)
        y = y * F.silu(zr)
    if mimo_out is None:
        return y
    return (y * mimo_out.to(y.dtype).transpose(0, 1)).sum(dim=2)


def siso_output(y: torch.Tensor, z):
    """SISO gate: y ⊙ silu(z) when z is given."""
    return y if z is None else y * F.silu(z.to(y.dtype))


def split_varlen(cu_seqlens: torch.Tensor):
    """(start, end) pairs of the packed sequences."""
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def run_form(core, q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, angles, D, input_states, cu_seqlens,
             pairing: str, **core_kwargs):
    """Shared driver of both reference forms, in the rank-expanded layout (R = 1 for SISO).

    q, k (B, T, R, G, N); v (B, T, H, P); q_bias, k_bias (H, R, N); mimo_v (H, R, P) or None; input states
    (angle (NS, H, A), ssm (NS, H, P, N), k (NS, R, H, N), v (NS, H, P)) or None. ``core`` maps the prepared
    tensors of equal-length sequences to (y (B, T, R, H, P), final ssm state (B, H, P, N)).
    Returns y in the compute dtype and the final states.
    """
    dtype = compute_dtype(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, angles, D, input_states)
    nheads = v.shape[2]
    if cu_seqlens is None:
        segments = [(slice(None), slice(None))]
    else:
        segments = [(slice(s, e), slice(i, i + 1)) for i, (s, e) in enumerate(split_varlen(cu_seqlens))]
    ys, finals = [], []
    for tsl, ssl in segments:
        state = None if input_states is None else [s[ssl] for s in input_states]
        theta = angle_cumsum(angles[:, tsl], dt[:, :, tsl], None if state is None else state[0], dtype)
        qh = expand_groups(q[:, tsl].to(dtype), nheads, dim=3) + q_bias.to(dtype).transpose(0, 1)
        kh = expand_groups(k[:, tsl].to(dtype), nheads, dim=3) + k_bias.to(dtype).transpose(0, 1)
        q_rot = rotate(qh, theta[:, :, None], pairing)
        k_rot = rotate(kh, theta[:, :, None], pairing)
        psi = 1.0 if mimo_v is None else mimo_v.to(dtype).transpose(0, 1)   # (R, H, P)
        v_seg = v[:, tsl]
        v_rank = v_seg.to(dtype)[:, :, None] * psi
        gamma, beta_nodecay, scale = trapezoid_weights(dt[:, :, tsl], trap[:, :, tsl], dtype)
        if state is None:
            ssm_in = k_in = v_in_rank = None
        else:
            ssm_in, k_in = state[1].to(dtype), state[2].to(dtype)
            v_in_rank = state[3].to(dtype)[:, None] * psi
        y, ssm_final = core(q_rot=q_rot, k_rot=k_rot, v_rank=v_rank, adt=adt[:, :, tsl].to(dtype), gamma=gamma,
                            beta_nodecay=beta_nodecay, scale=scale, ssm_in=ssm_in, k_in=k_in,
                            v_in_rank=v_in_rank, **core_kwargs)
        if D is not None:
            y = y + D.to(dtype)[:, None] * v_rank
        ys.append(y)
        finals.append((theta[:, -1], ssm_final, k_rot[:, -1], v_seg[:, -1]))
    y = torch.cat(ys, dim=1)
    final_states = tuple(torch.cat(parts, dim=0) for parts in zip(*finals))
    return y, final_states


def run_siso(core, q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states, cu_seqlens,
             **core_kwargs):
    """SISO = rank 1 with adjacent-pair rotation, no ψ/ζ/φ."""
    if input_states is not None:
        angle_in, ssm_in, k_in, v_in = input_states
        input_states = (angle_in, ssm_in, k_in[:, None], v_in)
    y, (angle, ssm, k_last, v_last) = run_form(
        core, q[:, :, None], k[:, :, None], v, adt, dt, trap, q_bias[:, None], k_bias[:, None], None, angles, D,
        input_states, cu_seqlens, pairing="adjacent", **core_kwargs)
    out = siso_output(y[:, :, 0], z).to(v.dtype)
    return out, (angle, ssm, k_last[:, 0], v_last)


def run_mimo(core, q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z,
             input_states, cu_seqlens, rms_norm, norm_weight, norm_eps, **core_kwargs):
    """MIMO: rank R with half-split rotation, ψ on the input, then the output stage."""
    y, final_states = run_form(core, q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, angles, D, input_states,
                               cu_seqlens, pairing="half", **core_kwargs)
    out = mimo_output(y, z, mimo_z, mimo_out, rms_norm, norm_weight, norm_eps).to(v.dtype)
    return out, final_states
