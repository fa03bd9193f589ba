"""Test helpers: error measures (torch only). The Triton interpreter bf16 patch lives in
``mamba3.testing.interpreter`` and the ahead-of-time compile helper in ``mamba3.testing.aot``; import those
explicitly (they import Triton)."""

from .errors import assert_rel_close, rel_frobenius

__all__ = ["rel_frobenius", "assert_rel_close"]
