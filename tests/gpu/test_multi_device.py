"""Tensors on a GPU other than the current one (skipped without two CUDA devices).

Triton launches a kernel on the *current* device and its current stream, whatever device the tensors are on; a
model on cuda:1 driven from a process whose current device is cuda:0 (the default) would hand cuda:1 pointers to a
kernel on cuda:0. The public operators therefore make the tensors' device current around their launches
(``ops.checks.on_device_of``; the decode step its own way). Here every Triton launch records the current device
(Triton's launch hook), and the results are checked against the float64 layer on the CPU.
"""
from __future__ import annotations

import pytest
import torch

from mamba3.modules import Mamba3
from mamba3.testing.errors import assert_rel_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs two CUDA devices")
CFGS = {"siso": dict(is_mimo=False), "mimo4": dict(is_mimo=True, mimo_rank=4)}


@pytest.fixture
def launch_devices():
    """The current CUDA device at every Triton launch while the test runs, with cuda:0 current."""
    from triton import knobs

    seen: list[int] = []
    previous = knobs.runtime.launch_enter_hook
    knobs.runtime.launch_enter_hook = lambda metadata: seen.append(torch.cuda.current_device())
    try:
        with torch.cuda.device(0):
            yield seen
    finally:
        knobs.runtime.launch_enter_hook = previous


def _layers(cfg, device):
    torch.manual_seed(0)
    m = Mamba3(256, d_state=64, headdim=64, layer_idx=0, device=device, dtype=torch.float32, **cfg)
    m64 = Mamba3(256, d_state=64, headdim=64, layer_idx=0, dtype=torch.float64, **cfg)
    m64.load_state_dict({k: v.double().cpu() for k, v in m.state_dict().items()})
    return m, m64


@pytest.mark.parametrize("name", list(CFGS))
def test_layer_on_the_second_gpu(name, launch_devices):
    m, m64 = _layers(CFGS[name], "cuda:1")
    u = torch.randn(2, 150, 256, device="cuda:1", requires_grad=True)
    u64 = u.detach().cpu().double().requires_grad_(True)
    allocated_on_0 = torch.cuda.memory_allocated(0)
    y, y64 = m(u), m64(u64)
    g = torch.randn_like(y64)
    y.backward(g.to("cuda:1"))
    y64.backward(g)
    torch.cuda.synchronize(1)
    assert launch_devices and set(launch_devices) == {1}, f"launches on devices {sorted(set(launch_devices))}"
    assert torch.cuda.current_device() == 0  # restored after the call
    assert torch.cuda.memory_allocated(0) == allocated_on_0
    assert_rel_close("out", y, y64, 1e-5)
    assert_rel_close("du", u.grad, u64.grad, 1e-4)
    p64 = dict(m64.named_parameters())
    for n, p in m.named_parameters():
        assert_rel_close(f"d{n}", p.grad, p64[n].grad, 1e-4)


@pytest.mark.parametrize("name", list(CFGS))
def test_decode_step_on_the_second_gpu(name, launch_devices):
    m, m64 = _layers(CFGS[name], "cuda:1")
    u = torch.randn(3, 12, 256, device="cuda:1")
    with torch.no_grad():
        cache = m.allocate_inference_cache(3, 12)
        steps = torch.cat([m.step(u[:, t:t + 1], cache) for t in range(12)], dim=1)
        full = m64(u.cpu().double())
    torch.cuda.synchronize(1)
    assert launch_devices and set(launch_devices) == {1}, f"launches on devices {sorted(set(launch_devices))}"
    assert_rel_close("step outputs", steps, full, 1e-5)
