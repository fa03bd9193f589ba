"""Register spills of the kernels the dispatcher chooses: SISO's defaults and every MIMO and decode-step launch, on
every CI architecture. Read from the cubin (cuobjdump's REG and STACK: the registers per thread and the stack frame
ptxas spills into), so the lane compiles nothing twice.

A guard against ptxas's spill-everything mode, in which it gives a kernel a fraction of its 255 registers and
spills the rest. Seen so far, registers / spill-store bytes / stack frame per thread:
- Triton 3.6 lowers an fp32 (IEEE) dot to FMA code that holds a whole reduction extent of both operands in
  registers; with 64-wide extents every SISO fp32 kernel collapsed on every architecture (32-40 registers, 28-47 KB
  of spill stores), and tf32x3 dots at chunk 64 on sm_80/89/120 (28-35 KB; sm_80, the fp32 bwd_dv at chunk 64: 32 /
  20624 / 8544 B). The fp32 path's default tiles avoid both (``ops/siso/configs.py``).
- sm_80 alone, the bf16 SISO bwd_dqk at N = 128, P = 64: 32 / 9838 / 3680 B, where the same PTX gets 255 registers
  on sm_86; fixed by an explicit register cap on SISO's gradient kernels there
  (``mamba3.ops.siso.configs.gradient_launch_options``).
- MIMO's output kernel: sm_100, fp32 at P = 32, 56 / 8368-9536 / 3648-3752 B; sm_80, 16-bit at P = 128, the
  epilogue backward reading a saved y, 32 / 5676 / 3920 B; fixed by the same cap there
  (``mamba3.ops.mimo.configs.output_launch_options``).
Every kernel guarded here that has a stack frame at all has 255 registers (of all SISO's launches, one non-default
one has a frame with fewer: 128 registers, 8 B, on sm_120; on sm_90 some MIMO kernels are capped at 128 or 168
registers, ``MimoConfig.fwd_out_maxnreg`` / ``bwd_out_maxnreg`` / ``state_maxnreg``, with frames of 0-88 B at
N = 128), and the largest frame is 3048 B (sm_90, the fp32 bwd_dv at N = 16, P = 128). So a kernel fails if it has a
frame of 1 KB or more with fewer than 128 registers (the collapse, whose frame alone is not larger than ordinary
pressure at the cap), or a frame over 4 KB at any register count (a collapse at the cap). Explicit non-default
chunks are not covered (chunk 64 on the fp32 path off sm_90 is the caller's choice).
"""

import os

import pytest

from mamba3.dispatch import CI_ARCHS
from mamba3.testing.aot import compile_launch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)

MAX_STACK_BYTES = 4096
COLLAPSE_REGS, COLLAPSE_STACK_BYTES = 128, 1024


def _default_launches():
    from mamba3.ops.mimo.configs import aot_launches as mimo_launches
    from mamba3.ops.siso.launches import aot_launches as siso_launches
    from mamba3.ops.step.configs import aot_launches as step_launches

    out = []
    for arch in CI_ARCHS:
        out += [(arch, launch) for launch in siso_launches(arch, default_only=True)]
        out += [(arch, launch) for launch in mimo_launches(arch)]
        out += [(arch, launch) for launch in step_launches(arch)]
    return out


@pytest.mark.parametrize("arch,launch", [pytest.param(arch, launch, id=f"sm{arch}-{launch.name}")
                                         for arch, launch in _default_launches()])
def test_default_kernels_do_not_spill_wholesale(arch, launch):
    r = compile_launch(launch, arch)
    where = (f"{launch.name} on sm_{arch} ({r.n_regs} registers, a {r.stack} B stack frame per thread; "
             f"config {launch.meta})")
    assert r.stack is not None and r.n_regs is not None, f"cuobjdump reported no REG / STACK: {where}"
    assert not (r.n_regs < COLLAPSE_REGS and r.stack >= COLLAPSE_STACK_BYTES), (
        f"ptxas's spill-everything allocation: {where}")
    assert r.stack <= MAX_STACK_BYTES, f"spills over {MAX_STACK_BYTES} B: {where}"
