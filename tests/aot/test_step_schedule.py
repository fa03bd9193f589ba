"""Where ptxas issues the decode step's prefetch (sm_90 SASS of the MIMO R = 4 streaming loop, issue 5's shape):
``StepConfig.early_out`` exists to pin the next state tile's loads to the top of the loop (ops/step/kernel.py)."""

import os

import pytest

from mamba3.testing.aot import compile_launch
from mamba3.testing.sass import loops, positions

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)

NAME = "mamba3_step_kernel[mimo4_p64_n128_bf16_large_batch]"


def _streaming_loop(name):
    from mamba3.ops.step.configs import aot_launches

    (launch,) = [x for x in aot_launches(90) if x.name == name]
    sass = compile_launch(launch, 90, sass=True).sass
    loop = max(loops(sass), key=lambda x: len(x.body))
    tile_loads = positions(loop, "LDG.E.EF.128")   # the next state tile: eight 16-byte evict-first loads per thread
    assert len(tile_loads) == 8, f"{name}: {len(tile_loads)} state-tile loads in the loop"
    return loop, tile_loads


def test_early_out_issues_the_next_tile_first():
    loop, tile_loads = _streaming_loop(NAME[:-1] + "-early-out]")
    assert max(tile_loads) < len(loop.body) // 8, (
        f"the next tile's loads issue at {tile_loads} of the loop's {len(loop.body)} instructions, not at its top")


def test_committed_loop_issues_the_next_tile_late():
    """What early_out is for: without it the loads issue in the loop's second half. If this fails, ptxas now issues
    them early by itself and early_out has nothing left to do."""
    loop, tile_loads = _streaming_loop(NAME)
    assert min(tile_loads) > len(loop.body) // 3, (tile_loads, len(loop.body))
