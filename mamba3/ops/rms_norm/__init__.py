"""RMS norm (optionally grouped and gated): ``api.rms_norm``; Triton forward and backward for CUDA tensors."""
from .api import rms_norm

__all__ = ["rms_norm"]
