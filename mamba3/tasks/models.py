"""A small sequence classifier around :class:`mamba3.Mamba3` blocks, with the ablations of the paper's
state-tracking table (§4.2, Table 5b) plus a MIMO row.

Layout: token embedding → n_layers × pre-norm residual blocks [h ← h + Mamba3(RMSNorm(h)); optionally
h ← h + SwiGLU-MLP(RMSNorm(h))] → RMSNorm → linear readout of the hidden state at each row's query position.

Variants (``variant``):

* ``mamba3``    the layer as is (SISO): data-dependent rotation angles θ_t = π·tanh(angles_t) from in_proj.
* ``norope``    no rotation: the angle slice of in_proj is replaced by zeros, so π·tanh(0)·Δ = 0 and the state
                never rotates (the paper's "w/o RoPE" row). The projection's weights stay but receive no gradient.
* ``fixedrope`` data-independent rotation (the paper's "w/ standard RoPE" row, with learnable frequencies):
                the phase of angle pair i at position t is t·ω_i, ω_i a learned constant initialised to the RoPE
                frequencies 10000^(−2i/(2A)). The layer's own rotation (which always scales the angle by the
                data-dependent Δ_t) is switched off and the rotation is applied to (C + C_bias) and (B + B_bias)
                before the operator — the same operator algebra (Proposition 3 of the paper: rotating B and C is
                the rotation of the state), with head-specific groups so per-head biases stay exact.
* ``mimo``      the layer with is_mimo=True, mimo_rank (default 4).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..modules.mamba3_layer import Mamba3
from ..modules.norms import RMSNorm
from ..ops.siso.api import mamba3_siso

VARIANTS = ("mamba3", "norope", "fixedrope", "mimo")


class NoRopeMamba3(Mamba3):
    """Mamba-3 with the rotation switched off: the angle rates are zero for every token."""

    def _project(self, u):
        z, x, Bp, Cp, ADT, DT, trap, angles = super()._project(u)
        return z, x, Bp, Cp, ADT, DT, trap, torch.zeros_like(angles)


def rotate_pairs(x: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (2i, 2i+1), i < A = phase.shape[-1], of x's last dimension by ``phase``
    (broadcast against x[..., :2A:2]); the remaining dimensions are left as they are."""
    A = phase.shape[-1]
    x1, x2, rest = x[..., 0:2 * A:2], x[..., 1:2 * A:2], x[..., 2 * A:]
    c, s = torch.cos(phase), torch.sin(phase)
    rot = torch.stack((c * x1 - s * x2, s * x1 + c * x2), dim=-1).flatten(-2)
    return torch.cat((rot, rest), dim=-1)


class FixedRopeMamba3(Mamba3):
    """Mamba-3 SISO with data-independent rotation: phase t·ω_i at position t (ω learned, RoPE-initialised)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.is_mimo:
            raise ValueError("fixedrope is implemented for SISO only")
        A = self.num_rope_angles
        self.rope_freq = nn.Parameter(10000.0 ** (-torch.arange(A, dtype=torch.float32) / max(A, 1)))
        self.rope_freq._no_weight_decay = True

    def forward(self, u, seq_idx=None, cu_seqlens=None, inference_params=None):
        if seq_idx is not None or inference_params is not None:
            raise NotImplementedError("FixedRopeMamba3 supports training forwards only (dense or cu_seqlens)")
        bsz, T, _ = u.shape
        H, G = self.nheads, self.ngroups
        z, x, Bp, Cp, ADT, DT, trap, angles = self._project(u)
        q = Cp[:, :, 0].repeat_interleave(H // G, dim=2) + self.C_bias[:, 0].to(Cp.dtype)    # (B, T, H, N)
        k = Bp[:, :, 0].repeat_interleave(H // G, dim=2) + self.B_bias[:, 0].to(Bp.dtype)
        pos = torch.arange(T, device=u.device, dtype=torch.float32)
        if cu_seqlens is not None:  # positions restart at every packed sequence (computed where cu_seqlens is)
            cu = cu_seqlens.long()
            starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1], output_size=T)
            pos = pos - starts.to(u.device, non_blocking=True).float()
        phase = (pos[:, None] * self.rope_freq[None, :])[None, :, None, :]                    # (1, T, 1, A)
        q, k = rotate_pairs(q.float(), phase).to(q.dtype), rotate_pairs(k.float(), phase).to(k.dtype)
        zero_bias = torch.zeros_like(self.C_bias[:, 0])
        y = mamba3_siso(q, k, x, ADT.transpose(1, 2), DT.transpose(1, 2), trap.transpose(1, 2), zero_bias,
                        zero_bias, torch.zeros_like(angles), self.D, None if self.is_outproj_norm else z,
                        cu_seqlens=cu_seqlens)
        y = y.reshape(bsz, T, self.d_inner)
        if self.is_outproj_norm:
            y = self.norm(y, z.reshape(bsz, T, self.d_inner))
        return self.out_proj(y.to(self.out_proj.weight.dtype))


def make_mixer(variant: str, d_model: int, **kw) -> Mamba3:
    if variant == "mamba3":
        return Mamba3(d_model, **kw)
    if variant == "norope":
        return NoRopeMamba3(d_model, **kw)
    if variant == "fixedrope":
        return FixedRopeMamba3(d_model, **kw)
    if variant == "mimo":
        return Mamba3(d_model, is_mimo=True, **kw)
    raise ValueError(f"unknown model variant {variant!r}; expected one of {VARIANTS}")


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        a, b = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(a * F.silu(b))


class Block(nn.Module):
    def __init__(self, variant: str, d_model: int, mlp_hidden: int, layer_idx: int, ssm_kw: dict):
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.mixer = make_mixer(variant, d_model, layer_idx=layer_idx, **ssm_kw)
        self.norm2 = RMSNorm(d_model) if mlp_hidden > 0 else None
        self.mlp = SwiGLU(d_model, mlp_hidden) if mlp_hidden > 0 else None

    def forward(self, h, cu_seqlens=None):
        h = h + self.mixer(self.norm(h), cu_seqlens=cu_seqlens)
        if self.mlp is not None:
            h = h + self.mlp(self.norm2(h))
        return h


class TaskModel(nn.Module):
    """tokens (B, T) → logits (B, classes) read at ``query`` (B,) positions (or (B, T, classes) without); with
    ``cu_seqlens`` (see ``data.pack``), tokens (1, total) are packed sequences and ``query`` indexes ``total``."""

    def __init__(self, vocab_size: int, num_classes: int, variant: str = "mamba3", d_model: int = 32,
                 n_layers: int = 1, d_state: int = 64, expand: int = 2, headdim: int = 16, mlp_ratio: float = 2.0,
                 rope_fraction: float = 0.5, mimo_rank: int = 4, chunk_size: int = 64, dt_min: float = 0.001,
                 dt_max: float = 0.1, a_activation: str = "heavy_tail", outproj_norm: bool = False):
        super().__init__()
        self.config = dict(vocab_size=vocab_size, num_classes=num_classes, variant=variant, d_model=d_model,
                           n_layers=n_layers, d_state=d_state, expand=expand, headdim=headdim, mlp_ratio=mlp_ratio,
                           rope_fraction=rope_fraction, mimo_rank=mimo_rank, chunk_size=chunk_size, dt_min=dt_min,
                           dt_max=dt_max, a_activation=a_activation, outproj_norm=outproj_norm)
        ssm_kw = dict(d_state=d_state, expand=expand, headdim=headdim, rope_fraction=rope_fraction,
                      chunk_size=chunk_size, n_layer=n_layers, dt_min=dt_min, dt_max=dt_max, a_activation=a_activation,
                      is_outproj_norm=outproj_norm)
        if variant == "mimo":
            ssm_kw["mimo_rank"] = mimo_rank
        self.embedding = nn.Embedding(vocab_size, d_model)
        mlp_hidden = int(round(mlp_ratio * d_model))
        self.layers = nn.ModuleList(Block(variant, d_model, mlp_hidden, i, ssm_kw) for i in range(n_layers))
        self.norm_f = RMSNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor, query: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embedding(tokens)
        for layer in self.layers:
            h = layer(h, cu_seqlens)
        if query is not None:
            h = h[0, query] if cu_seqlens is not None else h[torch.arange(h.shape[0], device=h.device), query]
        return self.head(self.norm_f(h))


def param_groups(model: nn.Module, weight_decay: float, exclude=()):
    """AdamW groups: decay on ≥2-D weights except embeddings; none on biases, norms, dt_bias, D, B/C biases,
    MIMO scalings and RoPE frequencies (1-D / flagged ``_no_weight_decay`` / 3-D per-head tensors), nor on the
    parameters in ``exclude`` (decayed otherwise by the caller)."""
    decay, no_decay = [], []
    excluded = {id(p) for p in exclude}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if (getattr(p, "_no_weight_decay", False) or p.dim() != 2 or name.startswith("embedding")
                or id(p) in excluded):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
