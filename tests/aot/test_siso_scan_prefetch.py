"""``SisoConfig.scan_prefetch`` (a candidate the dispatcher does not choose, so the AOT lane's problem classes leave
it out): the chunk-state scan with the next chunk's rows requested into L1 or L2 compiles on the newest and the
consumer architectures, fits the 99 KB shared-memory budget, does not spill, and its walk issues the prefetches
(CCTL.E.PF1 / PF2 in the SASS) inside the loop over chunks."""

import os

import pytest
import torch

from mamba3.testing.aot import compile_launch
from mamba3.testing.sass import loops, positions

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)

SMEM_BUDGET = 101_376


@pytest.mark.parametrize("level", ["L1", "L2"])
@pytest.mark.parametrize("arch", [90, 120])
def test_scan_prefetch_compiles_and_prefetches_in_the_walk(arch, level):
    from mamba3.ops.siso.launches import scan_launches

    launches = scan_launches(arch, torch.bfloat16, level)
    assert sorted(x.meta["MODE"] for x in launches) == [0, 0, 1], [x.name for x in launches]
    opcode = "CCTL.E.PF1" if level == "L1" else "CCTL.E.PF2"
    for launch in launches:
        assert launch.meta["PREFETCH"] == level
        r = compile_launch(launch, arch, spills=True, sass=True)
        assert r.total_shared <= SMEM_BUDGET, (launch.name, r.total_shared)
        assert r.n_spills == 0, (launch.name, r.n_spills, r.n_regs)
        walk = max(loops(r.sass), key=lambda loop: len(loop.body))
        found = len(positions(walk, opcode))
        # every prefetch is in the walk; one per thread and tensor row (x, z, k, sin θ, cos θ) and coefficient
        # plane, fewer where ptxas shares one between two (sm_120: 6 of the forward's 7)
        assert found == r.sass.count("CCTL"), (launch.name, found, r.sass.count("CCTL"))
        assert found >= (7 if launch.meta["MODE"] == 1 else 6), (launch.name, found)
