"""User-facing modules: the Mamba-3 layer, its inference cache, and a small causal LM with generate()."""
from .cache import InferenceParams, Mamba3State
from .lm import Mamba3Config, Mamba3LMHeadModel
from .mamba3_layer import Mamba3
from .norms import RMSNorm, RMSNormGated

__all__ = ["Mamba3", "Mamba3State", "InferenceParams", "Mamba3Config", "Mamba3LMHeadModel", "RMSNorm",
           "RMSNormGated"]
