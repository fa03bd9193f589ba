"""MIMO adapters of :mod:`mamba3.testing.compare` used by the tests (interpreter, GPU, seed fixture) and the
benchmark: ``call`` maps an inputs dict (as made by :func:`mamba3.testing.inputs.mimo_inputs`) onto the
positional signature shared by :func:`mimo_triton` and the references."""
from __future__ import annotations

from mamba3.testing.compare import TOLERANCES, assert_within_contract, errors, with_grads
from mamba3.testing.inputs import float64_copy

__all__ = ["TOLERANCES", "assert_within_contract", "call", "reference", "kernel", "compare"]


def call(fn, a, **extra):
    """Call a MIMO function (mimo_triton or a reference) with the inputs dict ``a``."""
    return fn(a["q"], a["k"], a["v"], a["adt"], a["dt"], a["trap"], a["q_bias"], a["k_bias"], a["mimo_v"],
              a["mimo_z"], a["mimo_out"], a["angles"], a.get("D"), a.get("z"), a.get("input_states"),
              cu_seqlens=a.get("cu_seqlens"), rms_norm=a.get("rms_norm", False),
              norm_weight=a.get("norm_weight"), norm_eps=a.get("norm_eps", 1e-5), **extra)


def reference(args, chunk_size=16, grads=None):
    """float64 chunked reference with gradients: (out, finals, {name: grad}, upstream)."""
    from mamba3.reference import mimo_chunked

    return with_grads(lambda **a: call(mimo_chunked, a, chunk_size=chunk_size), float64_copy(args), grads)


def _kernel(args, ups, chunk_size, config, precision):
    from .function import mimo_triton

    return with_grads(lambda **a: call(mimo_triton, a, chunk_size=chunk_size, config=config, precision=precision),
                      args, ups)


def kernel(args, ups, chunk_size=16, config=None, precision="ieee"):
    """mimo_triton with gradients: (out, finals, {name: grad})."""
    return _kernel(args, ups, chunk_size, config, precision)[:3]


def compare(args, chunk_size=16, config=None, ref=None):
    """{tensor name: relative Frobenius error} of mimo_triton against the float64 reference."""
    ref = reference(args) if ref is None else ref
    return errors(_kernel(args, ref[3], chunk_size, config, "ieee"), ref)
