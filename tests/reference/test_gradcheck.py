"""torch.autograd.gradcheck of the chunked form in float64 w.r.t. every input, input states included, with
gradients flowing in through the output and all four final states."""
import pytest
import torch

from mamba3.reference import mimo_chunked, siso_chunked
from mamba3.testing.inputs import float64_copy, mimo_inputs, replace_leaves, siso_inputs, tensor_leaves


def _gradcheck(fn, a, chunk_size):
    names, leaves = zip(*tensor_leaves(a))
    leaves = [x.clone().requires_grad_(True) for x in leaves]

    def run(*xs):
        out, states = fn(**replace_leaves(a, dict(zip(names, xs))), chunk_size=chunk_size)
        return (out, *states)      # gradients enter through the output and all four final states

    assert torch.autograd.gradcheck(run, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_siso_gradcheck(states, shared):
    a = float64_copy(siso_inputs(bsz=1, seqlen=7, nheads=2, ngroups=1, dstate=4, headdim=2, nangles=2,
                                 states=states, shared_angles=shared, seed=5))
    _gradcheck(siso_chunked, a, chunk_size=4)


@pytest.mark.parametrize("variant", ["contract_states", "per_rank", "rms_norm_states"])
def test_mimo_gradcheck(variant):
    a = float64_copy(mimo_inputs(bsz=1, seqlen=6, nheads=2, ngroups=1, dstate=4, headdim=2, rank=2, nangles=1,
                                 states="states" in variant, with_out=variant != "per_rank",
                                 rms_norm="rms_norm" in variant, seed=6))
    _gradcheck(mimo_chunked, a, chunk_size=4)


def test_siso_gradcheck_varlen():
    a = float64_copy(siso_inputs(bsz=1, seqlen=7, nheads=2, ngroups=2, dstate=4, headdim=2, nangles=2,
                                 states=True, cu_seqlens=[0, 1, 7], seed=7))
    _gradcheck(siso_chunked, a, chunk_size=4)
