"""RMS norms used by the layer and the LM (the parameter is ``weight`` as in mamba_ssm), on
:func:`mamba3.ops.rms_norm.rms_norm`: Triton kernels for CUDA tensors, the PyTorch reference
(:func:`mamba3.reference.rms_norm`) elsewhere."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.rms_norm import rms_norm


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
            return rms_norm(x * F.silu(z.to(x.dtype)), self.weight, self.eps, self.group_size)
        return rms_norm(x, self.weight, self.eps, self.group_size, z)
