"""The RMS norms of the layer and the models, in plain PyTorch (the specification of ``mamba3.ops.rms_norm``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, group_size: int | None = None,
             z: torch.Tensor | None = None) -> torch.Tensor:
    """x / rms(x) · weight over the last dimension, or over groups of ``group_size`` of it; with z, times silu(z)
    (the gate after the norm). Computed in fp32 (float64 for float64 inputs), returned in x's dtype."""
    dtype = x.dtype
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    xf = x.to(ct)
    if group_size is not None and group_size != x.shape[-1]:
        xf = xf.unflatten(-1, (-1, group_size))
    xf = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    xf = xf.flatten(-2) if xf.dim() > x.dim() else xf
    if weight is not None:
        xf = xf * weight.to(ct)
    if z is not None:
        xf = xf * F.silu(z.to(ct))
    return xf.to(dtype)
