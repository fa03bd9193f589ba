"""The Mamba-3 layer: drop-in compatible with ``mamba_ssm.modules.mamba3.Mamba3`` (constructor, parameter
names, shapes and initialisation), on top of :func:`mamba3.mamba3_siso` / :func:`mamba3.mamba3_mimo` and the
decode-step op.

in_proj (no bias) → [z (d_inner), x (d_inner), B (N·G·R), C (N·G·R), dd_dt (H), dd_A (H), trap (H), angles (A)]
  B, C: "(r g n)" → (…, R, G, N), RMS-normalised over N (B_norm, C_norm), plus B_bias / C_bias (H, R, N);
  DT = softplus(dd_dt + dt_bias); A = −heavy_tail(dd_A) clamped to ≤ −A_floor; ADT = A·DT
  (a_activation="softplus": A = −softplus(dd_A), the official module's form before its commit c69aaab);
  trap: the trapezoid logit; angles (B, T, A): rates shared by every head (never expanded in memory).
Operator: q = C, k = B, v = x, z gate, D skip; SISO rotates adjacent pairs, MIMO half-split pairs with
mimo_x (ψ), mimo_z (ζ), mimo_o (φ). Optional output norm (is_outproj_norm): headwise RMSNorm with weight
``norm.weight`` before the silu(z) gate (fused into the MIMO operator, in PyTorch for SISO). Then out_proj.
Beyond the official constructor: ``a_activation`` (above), ``mimo_save_y`` (:func:`mamba3.mamba3_mimo`'s
``save_y``: a faster backward for R·H·P fp32 more memory per token, in eager mode) and ``siso_save_states``
(:func:`mamba3.mamba3_siso`'s ``save_states``: a faster 16-bit backward for H·P·N/chunk 16-bit values more memory
per token, in eager mode).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.mimo.api import mamba3_mimo
from ..ops.siso.api import mamba3_siso
from ..ops.step.api import mamba3_mimo_step, mamba3_siso_step
from .cache import InferenceParams, Mamba3State, allocate_state
from .norms import RMSNormGated


def _chunked_ops():
    """The operators: the public functions in eager mode, their custom-op wrappers under torch.compile (the
    public functions are compiler-disabled; the custom ops have fake implementations and autograd)."""
    if torch.compiler.is_compiling():
        from ..ops import custom_ops

        return custom_ops.siso, custom_ops.mimo
    return mamba3_siso, mamba3_mimo


def heavy_tail(x: torch.Tensor) -> torch.Tensor:
    """1 + x for x ≥ 0, 1 / (1 − x) for x < 0 (continuous, with slope 1 at 0)."""
    return torch.where(x >= 0, 1.0 + x, 1.0 / (1.0 - torch.clamp(x, max=0.0)))


# A = −activation(dd_A). "heavy_tail" is the official module's (since c69aaab, "Stabilize data-dependent A");
# before it A was −softplus(dd_A). They differ most where slow forgetting lives: A = −0.01 takes dd_A ≈ −100 with
# heavy_tail and ≈ −4.6 with softplus, so the choice bounds how far a trained model's memory reaches.
A_ACTIVATIONS = {"heavy_tail": heavy_tail, "softplus": F.softplus}


def num_rope_angles(d_state: int, rope_fraction: float) -> int:
    rotated = int(d_state * rope_fraction)
    rotated -= rotated % 2
    return rotated // 2


def seq_idx_to_cu_seqlens(seq_idx: torch.Tensor) -> torch.Tensor:
    """(1, T) sequence ids (non-decreasing) → cu_seqlens (host sync: prefer passing cu_seqlens)."""
    s = seq_idx.reshape(-1)
    starts = torch.nonzero(torch.diff(s, prepend=s[:1] - 1)).reshape(-1)
    return torch.cat([starts, starts.new_tensor([s.numel()])]).to(torch.int32)


class Mamba3(nn.Module):
    def __init__(self, d_model, d_state=128, expand=2, headdim=64, ngroups=1, rope_fraction=0.5, dt_min=0.001,
                 dt_max=0.1, dt_init_floor=1e-4, A_floor=1e-4, is_outproj_norm=False, is_mimo=False, mimo_rank=4,
                 fuse_pregate_headwise_norm=True, chunk_size=64, dropout=0.0, layer_idx=None, n_layer=None,
                 device=None, dtype=None, a_activation="heavy_tail", mimo_save_y=False, siso_save_states=False,
                 **kwargs):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        if rope_fraction not in (0.5, 1.0):
            raise ValueError(f"rope_fraction must be 0.5 or 1.0, got {rope_fraction}")
        if a_activation not in A_ACTIVATIONS:
            raise ValueError(f"a_activation must be one of {sorted(A_ACTIVATIONS)}, got {a_activation!r}")
        self.a_activation = a_activation
        self.d_model, self.d_state, self.expand, self.headdim = d_model, d_state, expand, headdim
        self.ngroups, self.rope_fraction = ngroups, rope_fraction
        self.A_floor = A_floor
        self.is_outproj_norm, self.is_mimo = is_outproj_norm, is_mimo
        self.mimo_rank = mimo_rank if is_mimo else 1
        self.fuse_pregate_headwise_norm = fuse_pregate_headwise_norm
        self.mimo_save_y = mimo_save_y  # mamba3_mimo's save_y: a faster backward for more memory (eager mode)
        self.siso_save_states = siso_save_states  # mamba3_siso's save_states: the same trade (eager mode)
        self.chunk_size = chunk_size      # accepted for compatibility; the dispatcher picks kernel chunk sizes
        self.dropout = dropout
        self.layer_idx, self.n_layer = layer_idx, n_layer
        self.d_inner = expand * d_model
        if self.d_inner % headdim:
            raise ValueError(f"d_inner = expand·d_model = {self.d_inner} must be a multiple of headdim={headdim}")
        self.nheads = self.d_inner // headdim
        if self.nheads % ngroups:
            raise ValueError(f"nheads={self.nheads} must be a multiple of ngroups={ngroups}")
        self.num_rope_angles = num_rope_angles(d_state, rope_fraction)
        R, G, N, H = self.mimo_rank, ngroups, d_state, self.nheads
        d_in_proj = 2 * self.d_inner + 2 * N * G * R + 3 * H + self.num_rope_angles
        self.in_proj = nn.Linear(d_model, d_in_proj, bias=False, **factory)

        dt = torch.exp(torch.rand(H, device=device) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = torch.clamp(dt, min=dt_init_floor)
        inv_dt = dt + torch.log(-torch.expm1(-dt))             # softplus(inv_dt) = dt
        self.dt_bias = nn.Parameter(inv_dt.to(torch.float32))
        self.dt_bias._no_weight_decay = True

        self.B_norm = RMSNormGated(N, eps=1e-5, **factory)
        self.C_norm = RMSNormGated(N, eps=1e-5, **factory)
        self.B_bias = nn.Parameter(torch.ones(H, R, N, device=device, dtype=torch.float32))
        self.C_bias = nn.Parameter(torch.ones(H, R, N, device=device, dtype=torch.float32))
        if is_mimo:
            self.mimo_x = nn.Parameter(torch.full((H, R, headdim), 1.0 / R, device=device, dtype=torch.float32))
            self.mimo_z = nn.Parameter(torch.ones(H, R, headdim, device=device, dtype=torch.float32))
            self.mimo_o = nn.Parameter(torch.full((H, R, headdim), 1.0 / R, device=device, dtype=torch.float32))
        self.D = nn.Parameter(torch.ones(H, device=device, dtype=torch.float32))
        self.D._no_weight_decay = True
        if is_outproj_norm:
            self.norm = RMSNormGated(self.d_inner, eps=1e-5, norm_before_gate=True, group_size=headdim, **factory)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False, **factory)

    # ------------------------------------------------------------------------------------------ projections
    def in_proj_slices(self) -> dict[str, slice]:
        """The rows of ``in_proj.weight`` that produce each of z, x, B, C, dd_dt, dd_A, trap and angles."""
        R, G, N, H = self.mimo_rank, self.ngroups, self.d_state, self.nheads
        sizes = {"z": self.d_inner, "x": self.d_inner, "B": N * G * R, "C": N * G * R, "dd_dt": H, "dd_A": H,
                 "trap": H, "angles": self.num_rope_angles}
        out, start = {}, 0
        for name, size in sizes.items():
            out[name] = slice(start, start + size)
            start += size
        return out

    def _project(self, u):
        """in_proj and the derived operator inputs for u (…, d_model), time-major (…, T or nothing)."""
        R, G, N, H, P = self.mimo_rank, self.ngroups, self.d_state, self.nheads, self.headdim
        sizes = [s.stop - s.start for s in self.in_proj_slices().values()]
        z, x, Bp, Cp, dd_dt, dd_A, trap, angles = torch.split(self.in_proj(u), sizes, dim=-1)
        z, x = z.unflatten(-1, (H, P)), x.unflatten(-1, (H, P))
        Bp = self.B_norm(Bp.unflatten(-1, (R, G, N)))
        Cp = self.C_norm(Cp.unflatten(-1, (R, G, N)))
        fdt = torch.float64 if u.dtype == torch.float64 else torch.float32
        A = torch.clamp(-A_ACTIVATIONS[self.a_activation](dd_A.to(fdt)), max=-self.A_floor)
        DT = F.softplus(dd_dt.to(fdt) + self.dt_bias.to(fdt))
        ADT = A * DT
        return z, x, Bp, Cp, ADT, DT, trap, angles.to(fdt)

    def _norm_weight(self):
        return self.norm.weight.reshape(self.nheads, self.headdim) if self.is_outproj_norm else None

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, u, seq_idx=None, cu_seqlens=None, inference_params=None):
        """u (B, T, d_model) → (B, T, d_model). cu_seqlens: packed sequences with B = 1.

        inference_params (:class:`InferenceParams`): the layer's state lives in
        ``key_value_memory_dict[layer_idx]``; with ``seqlen_offset == 0`` the forward is a prefill (the final
        states are written to the cache), later calls continue from the cache (one token: the decode step;
        several tokens: a chunked forward from the cached states).
        """
        if cu_seqlens is None and seq_idx is not None:
            cu_seqlens = seq_idx_to_cu_seqlens(seq_idx)
        if inference_params is None:
            return self._chunked(u, cu_seqlens, None, False)
        cache = self._get_cache(inference_params, u)
        if inference_params.seqlen_offset > 0 and u.shape[1] == 1 and cu_seqlens is None:
            return self.step(u, cache)
        nseq = u.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
        rows = cache.rows(nseq)
        input_states = self._op_states(rows) if inference_params.seqlen_offset > 0 else None
        out, final = self._chunked(u, cu_seqlens, input_states, True)
        with torch.no_grad():
            for dst, src in zip(self._op_states(rows), final):
                dst.copy_(src)
        return out

    def _op_states(self, state: Mamba3State):
        """The operator's state tuple (views of the cache): SISO's k is (B, H, N)."""
        return (state.angle, state.ssm, state.k[:, 0] if not self.is_mimo else state.k, state.v)

    def _chunked(self, u, cu_seqlens, input_states, return_final_states):
        bsz, seqlen, _ = u.shape
        z, x, Bp, Cp, ADT, DT, trap, angles = self._project(u)
        ADT, DT, trap = (t.transpose(1, 2) for t in (ADT, DT, trap))       # (B, H, T)
        siso_op, mimo_op = _chunked_ops()
        if self.is_mimo:
            # save_y is the eager operator's (the custom ops' backward replays the forward, computing y again)
            extra = {"save_y": True} if self.mimo_save_y and mimo_op is mamba3_mimo else {}
            res = mimo_op(Cp, Bp, x, ADT, DT, trap, self.C_bias, self.B_bias, self.mimo_x, self.mimo_z,
                          self.mimo_o, angles, self.D, z, input_states, cu_seqlens=cu_seqlens,
                          rms_norm=self.is_outproj_norm, norm_weight=self._norm_weight(),
                          norm_eps=self.norm.eps if self.is_outproj_norm else 1e-5,
                          return_final_states=return_final_states, **extra)
        else:
            gate = None if self.is_outproj_norm else z
            extra = {"save_states": True} if self.siso_save_states and siso_op is mamba3_siso else {}
            res = siso_op(Cp[:, :, 0], Bp[:, :, 0], x, ADT, DT, trap, self.C_bias[:, 0], self.B_bias[:, 0],
                          angles, self.D, gate, input_states, cu_seqlens=cu_seqlens,
                          return_final_states=return_final_states, **extra)
        y, final = res if return_final_states else (res, None)
        y = y.reshape(bsz, seqlen, self.d_inner)
        if self.is_outproj_norm and not self.is_mimo:
            y = self.norm(y, z.reshape(bsz, seqlen, self.d_inner))
        out = self.out_proj(y.to(self.out_proj.weight.dtype))
        return (out, final) if return_final_states else out

    # ------------------------------------------------------------------------------------------ decoding
    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None, **kwargs):
        """A zeroed :class:`Mamba3State` for ``batch_size`` rows (``max_seqlen`` is not needed: the state has a
        fixed size). v is kept in ``dtype`` (default: the layer's dtype)."""
        w = self.in_proj.weight
        return allocate_state(batch_size, self.nheads, self.headdim, self.d_state, self.num_rope_angles,
                              self.mimo_rank, w.device, dtype or w.dtype)

    def _get_cache(self, inference_params: InferenceParams, u):
        key = self.layer_idx
        if key is None:
            raise ValueError("decoding with inference_params needs the layer's layer_idx")
        cache = inference_params.key_value_memory_dict.get(key)
        if cache is None:
            cache = self.allocate_inference_cache(max(inference_params.max_batch_size, u.shape[0]),
                                                  inference_params.max_seqlen, dtype=u.dtype)
            inference_params.key_value_memory_dict[key] = cache
        return cache

    def step(self, hidden_states, inference_cache, state_batch_indices=None):
        """One token: hidden_states (B, 1, d_model) or (B, d_model) → the same shape; ``inference_cache`` (a
        :class:`Mamba3State` or the 4-tuple (angle, ssm, k, v)) is updated in place. With
        ``state_batch_indices`` (B,) the cache is a pool and row b uses cache row state_batch_indices[b]."""
        squeeze = hidden_states.dim() == 3
        if squeeze:
            if hidden_states.shape[1] != 1:
                raise ValueError(f"step takes one token per row, got hidden_states of shape "
                                 f"{tuple(hidden_states.shape)}; use forward() for several tokens")
            hidden_states = hidden_states[:, 0]
        state = Mamba3State(*inference_cache)
        if state_batch_indices is None and state.ssm.shape[0] != hidden_states.shape[0]:
            state = state.rows(hidden_states.shape[0])
        z, x, Bp, Cp, ADT, DT, trap, angles = self._project(hidden_states)
        if self.is_mimo:
            y = mamba3_mimo_step(Cp, Bp, x, ADT, DT, trap, self.C_bias, self.B_bias, self.mimo_x, self.mimo_z,
                                 self.mimo_o, angles, self.D, z, tuple(state), rms_norm=self.is_outproj_norm,
                                 norm_weight=self._norm_weight(),
                                 norm_eps=self.norm.eps if self.is_outproj_norm else 1e-5,
                                 state_batch_indices=state_batch_indices)
        else:
            gate = None if self.is_outproj_norm else z
            y = mamba3_siso_step(Cp[:, 0], Bp[:, 0], x, ADT, DT, trap, self.C_bias[:, 0], self.B_bias[:, 0], angles,
                                 self.D, gate, self._op_states(state), state_batch_indices=state_batch_indices)
        y = y.reshape(y.shape[0], self.d_inner)
        if self.is_outproj_norm and not self.is_mimo:
            y = self.norm(y, z.reshape(y.shape[0], self.d_inner))
        out = self.out_proj(y.to(self.out_proj.weight.dtype))
        return out[:, None] if squeeze else out
