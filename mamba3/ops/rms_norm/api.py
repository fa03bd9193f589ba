"""Public RMS norm operator (the layer's and the models' norms call it)."""
from __future__ import annotations

import torch

from ...reference.norms import rms_norm as rms_norm_reference
from ..checks import use_triton
from .configs import MAX_ROW, next_pow2


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, group_size: int | None = None,
             z: torch.Tensor | None = None, *, backend: str = "auto") -> torch.Tensor:
    """x / rms(x) · weight over the last dimension, or over each group of ``group_size`` of it, then (with z) times
    silu(z). Computed in fp32 (float64 on the reference backend for float64 inputs), returned in x's dtype.

    Args:
        x: (..., W). weight: (W,) or None. z: None or x's shape (the gate, applied after the norm).
        group_size: None (the whole row) or a divisor of W.
        backend: "auto" (Triton for CUDA tensors whose rows, groups and group size padded to powers of two, hold
            at most ``configs.MAX_ROW`` elements; the PyTorch reference elsewhere and while torch.compile traces,
            which fuses the reference itself), "reference" or "triton" (CPU tensors: the Triton interpreter,
            TRITON_INTERPRET=1; wider rows: an error).
    """
    width = x.shape[-1]
    size = width if group_size is None else group_size
    if size <= 0 or width % size:
        raise ValueError(f"group_size {group_size} must divide the last dimension {width}")
    if weight is not None and tuple(weight.shape) != (width,):
        raise ValueError(f"weight must have shape ({width},), got {tuple(weight.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"z must have x's shape {tuple(x.shape)}, got {tuple(z.shape)}")
    if x.numel() == 0 or not use_triton(backend, (x, weight, z)) or backend == "auto" and (
            torch.compiler.is_compiling()
            or next_pow2(width // size) * next_pow2(size) > MAX_ROW):
        return rms_norm_reference(x, weight, eps, group_size, z)
    from .function import rms_norm_triton

    return rms_norm_triton(x, weight, z, eps, size)
