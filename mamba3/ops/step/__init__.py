"""One-token decode step of Mamba-3 (SISO and MIMO): PyTorch reference and Triton kernel."""
from .api import mamba3_mimo_step, mamba3_siso_step

__all__ = ["mamba3_siso_step", "mamba3_mimo_step"]
