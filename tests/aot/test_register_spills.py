"""Register spills of the SISO and decode-step kernels the dispatcher chooses by default (sm_90, ptxas -v).

A guard against ptxas's spill-everything mode: Triton 3.6 lowers an fp32 (IEEE) dot to FMA code that holds a
whole reduction extent of both operands in registers, and with 64-wide extents ptxas gave up (32-40 registers,
28-47 KB of spill stores per thread in every SISO fp32 kernel, on every architecture). The fp32 path's default
tiles keep every extent ≤ 32 (``ops/siso/configs.py``). The bound below is far under that failure and above the
small spills the 16-bit kernels have at the 255-register cap (AOT, sm_90: output 124 B, bwd_dv 64 B, bwd_dqk
352 B), so it fails on a relapse, not on ordinary register pressure. Explicit non-default chunks are not covered
(chunk 64 on the fp32 path still spills 9-20 KB: it is the caller's choice).
"""

import os

import pytest

from mamba3.testing.aot import compile_launch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)

ARCH = 90
MAX_SPILL_BYTES = 1024


def _default_launches():
    from mamba3.ops.siso.launches import aot_launches as siso_launches
    from mamba3.ops.step.configs import aot_launches as step_launches

    return siso_launches(ARCH, default_only=True) + step_launches(ARCH)


_LAUNCHES = _default_launches()


@pytest.mark.parametrize("launch", _LAUNCHES, ids=[launch.name for launch in _LAUNCHES])
def test_default_kernels_do_not_spill_wholesale(launch):
    r = compile_launch(launch, ARCH, spills=True)
    assert r.n_spills <= MAX_SPILL_BYTES, (
        f"{launch.name} on sm_{ARCH}: {r.n_spills} B of register spill stores per thread ({r.n_regs} registers) "
        f"> {MAX_SPILL_BYTES} B; config {launch.meta}")
