"""mamba3: the Mamba-3 sequence layer (SISO and MIMO) as exact, portable Triton kernels, with a PyTorch
reference that is the specification and the CPU backend."""
from .ops.mimo.api import mamba3_mimo
from .ops.siso.api import mamba3_siso

__version__ = "0.1.0"
__all__ = ["mamba3_siso", "mamba3_mimo", "__version__"]
