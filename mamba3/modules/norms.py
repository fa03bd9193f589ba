"""RMS norms used by the layer and the LM (plain PyTorch; the parameter is ``weight`` as in mamba_ssm)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, group_size: int | None = None):
    """x / rms(x) · weight over the last dimension, or over groups of ``group_size`` of it. Computed in fp32
    (fp64 for fp64 inputs), returned in x's dtype."""
    dtype = x.dtype
    xf = x.to(torch.float64 if dtype == torch.float64 else torch.float32)
    if group_size is not None and group_size != x.shape[-1]:
        xf = xf.unflatten(-1, (-1, group_size))
    xf = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    xf = xf.flatten(-2) if xf.dim() > x.dim() else xf
    if weight is not None:
        xf = xf * weight.to(xf.dtype)
    return xf.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class RMSNormGated(nn.Module):
    """RMSNorm with an optional silu gate, over groups of ``group_size`` (None = the whole last dimension).

    norm_before_gate=True:  y = rmsnorm(x)·w ⊙ silu(z);   False: y = rmsnorm(x ⊙ silu(z))·w.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = True, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x, z=None):
        if z is not None and not self.norm_before_gate:
            x = x * F.silu(z.to(x.dtype))
        y = rms_norm(x, self.weight, self.eps, self.group_size)
        if z is not None and self.norm_before_gate:
            yf = y.float() if y.dtype != torch.float64 else y
            y = (yf * F.silu(z.to(yf.dtype))).to(y.dtype)
        return y
