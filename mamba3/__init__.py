"""mamba3: the Mamba-3 sequence layer (SISO and MIMO) as exact, portable Triton kernels, with a PyTorch
reference that is the specification and the CPU backend."""
from .modules import InferenceParams, Mamba3, Mamba3Config, Mamba3LMHeadModel, Mamba3State
from .ops.mimo.api import mamba3_mimo
from .ops.siso.api import mamba3_siso
from .ops.step.api import mamba3_mimo_step, mamba3_siso_step

__version__ = "0.1.0"
__all__ = ["mamba3_siso", "mamba3_mimo", "mamba3_siso_step", "mamba3_mimo_step", "Mamba3", "Mamba3Config",
           "Mamba3LMHeadModel", "Mamba3State", "InferenceParams", "__version__"]
