"""The specification of Mamba-3 in plain PyTorch: the recurrent definition and the chunked form."""
from .chunked import mimo_chunked, siso_chunked
from .norms import rms_norm
from .recurrent import mimo_recurrent, siso_recurrent

__all__ = ["siso_recurrent", "siso_chunked", "mimo_recurrent", "mimo_chunked", "rms_norm"]
