"""The chunked operators never make the host wait for the GPU (skipped without CUDA).

Forward and backward run under ``torch.cuda.set_sync_debug_mode("error")``, which raises on a synchronising CUDA
call made through PyTorch (a read of a device value on the host, a blocking host-to-device copy, ...). One such
copy in the middle of the SISO backward (a Python zero assigned through advanced indexing) made the host wait for
every backward and cost 1.4 of its 10.7 ms on the H200 (ninth session): the GPU then idled while the host caught
up with the launches after it. Dense batches, after a first call (which compiles and builds its chunk tables);
varlen calls read a device ``cu_seqlens`` on the host by design (pass it as a CPU tensor to avoid that).
"""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@contextmanager
def _synchronisation_is_an_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _forward_backward_twice(run, args):
    from mamba3.testing.inputs import tensor_leaves

    leaves = [x.requires_grad_(True) for _, x in tensor_leaves(args)]

    def once():
        out, finals = run(args)
        loss = out.float().sum() + sum(f.float().sum() for f in finals)
        torch.autograd.grad(loss, leaves, allow_unused=True)

    once()
    torch.cuda.synchronize()
    with _synchronisation_is_an_error():
        once()
    torch.cuda.synchronize()


@pytest.mark.parametrize("states", [False, True], ids=["no-states", "states"])
def test_siso_forward_backward_never_synchronises(states):
    from mamba3.ops.siso.check import make_case, siso_kernel

    args = make_case(dtype=torch.bfloat16, B=2, T=200, H=4, G=1, N=64, P=64, A=16, states=states, device="cuda")
    _forward_backward_twice(lambda a: siso_kernel(None)(**a), args)


@pytest.mark.parametrize("states", [False, True], ids=["no-states", "states"])
def test_mimo_forward_backward_never_synchronises(states):
    from mamba3.ops.mimo.check import call
    from mamba3.ops.mimo.function import mimo_triton
    from mamba3.testing.inputs import mimo_inputs

    args = mimo_inputs(bsz=2, seqlen=200, nheads=4, ngroups=1, dstate=64, headdim=32, rank=4, nangles=16,
                       dtype=torch.bfloat16, device="cuda", states=states, with_D=True, with_z=True)
    _forward_backward_twice(lambda a: call(mimo_triton, a, chunk_size=16, precision="ieee"), args)


@pytest.mark.parametrize("op", ["siso", "mimo"])
def test_custom_ops_forward_backward_never_synchronise(op):
    """The same through the torch custom ops (``mamba3::siso`` / ``mimo`` and their backward ops: what a
    ``torch.compile``d model runs; SISO's backward op calls the Triton backward directly, MIMO's replays the forward
    under autograd). Passed on the H200 (eighteenth session): the custom ops' former do_bench gap (SISO B8 T4096
    12.0 against 7.7 ms eager) was the replay's host time, not a synchronisation."""
    from mamba3.ops import custom_ops
    from mamba3.testing.inputs import mimo_inputs, siso_inputs

    kw = dict(bsz=2, seqlen=200, nheads=4, ngroups=1, dstate=64, headdim=64, nangles=16, dtype=torch.bfloat16,
              device="cuda", states=True, with_D=True, with_z=True)
    if op == "siso":
        args = siso_inputs(**kw)
        run = lambda a: custom_ops.siso(**a, return_final_states=True)
    else:
        args = mimo_inputs(rank=4, **kw)
        run = lambda a: custom_ops.mimo(**a, return_final_states=True)
    _forward_backward_twice(run, args)
