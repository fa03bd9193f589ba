"""The PyTorch reference (the CPU backend) also runs on CUDA tensors and agrees with itself on the CPU."""
import pytest
import torch

import mamba3
from mamba3.testing.errors import assert_rel_close
from mamba3.testing.inputs import mimo_inputs, siso_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("op", ["siso", "mimo"])
def test_reference_backend_on_cuda_matches_cpu(op):
    fn, make = (mamba3.mamba3_siso, siso_inputs) if op == "siso" else (mamba3.mamba3_mimo, mimo_inputs)
    a_cpu = make(seqlen=50, states=True, dtype=torch.float64)
    a_gpu = make(seqlen=50, states=True, dtype=torch.float64, device="cuda")
    out_cpu, states_cpu = fn(**a_cpu, backend="reference", return_final_states=True)
    out_gpu, states_gpu = fn(**a_gpu, backend="reference", return_final_states=True)
    assert_rel_close("out", out_gpu, out_cpu, 1e-12)
    for name, x, ref in zip(("angle", "ssm", "k", "v"), states_gpu, states_cpu):
        assert_rel_close(f"final {name}", x, ref, 1e-12)
