"""The decode step's lane sums (ops/step/kernel.py): inline PTX that reduces and scatters values across the lanes
of a warp is right only for the lane order it was written for, which Triton's layouts decide. Two checks without
a GPU: the PTX itself, run by a small interpreter of the instructions it uses, computes the documented sums for
that lane order; and in every kernel the dispatcher compiles with lane sums, on every CI architecture, the PTX's
operands have that lane order in the TritonGPU IR (a Triton upgrade that changes it fails here, not on a GPU)."""

import os
import re

import numpy as np
import pytest

from mamba3.testing.aot import CI_ARCHS, compile_launch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)


def run_ptx(ptx: str, inputs: np.ndarray) -> np.ndarray:
    """Run the lane-sum PTX on 32 lanes: inputs (nvalues, 32) → the output register of each lane."""
    regs = [{f"${j + 1}": float(inputs[j, lane]) for j in range(inputs.shape[0])} for lane in range(32)]
    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        a = [x.strip() for x in rest.split(",")]
        if op == "shfl.sync.bfly.b32":
            assert a[3:] == ["0x1f", "0xffffffff"], line
            sent = [r[a[1]] for r in regs]
            for lane, r in enumerate(regs):
                r[a[0]] = sent[lane ^ int(a[2])]
            continue
        for lane, r in enumerate(regs):
            val = lambda x: r[x] if x in r else int(x, 0)
            if op == "mov.u32":
                assert a[1] == "%laneid", line
                r[a[0]] = lane
            elif op == "and.b32":
                r[a[0]] = val(a[1]) & val(a[2])
            elif op == "setp.ne.u32":
                r[a[0]] = val(a[1]) != val(a[2])
            elif op == "selp.f32":
                r[a[0]] = r[a[1]] if r[a[3]] else r[a[2]]
            elif op in ("add.f32", "mov.f32"):
                r[a[0]] = r[a[1]] + (r[a[2]] if op == "add.f32" else 0.0)
            else:
                raise AssertionError(f"instruction not modelled: {line}")
    return np.array([r["$0"] for r in regs])


@pytest.mark.parametrize("rank", [2, 4])
def test_lane_sum_ptx_reduces_and_scatters(rank):
    from mamba3.ops.step import kernel

    ptx = {2: kernel._LANE_SUM_PTX_R2, 4: kernel._LANE_SUM_PTX_R4}[rank].value
    nvalues = 4 * rank
    x = np.random.default_rng(rank).standard_normal((nvalues, 32))
    got = run_ptx(ptx, x)
    lanes = np.arange(32)
    half = lanes & 16
    j = (lanes & 15) // (16 // nvalues)
    want = np.array([x[j[lane], half[lane]:half[lane] + 16].sum() for lane in lanes])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert ptx.count("shfl.sync") == nvalues - 1 + (4 - int(np.log2(nvalues)))


def _lane_sum_launches():
    from mamba3.ops.step.configs import aot_launches

    return [launch for launch in aot_launches(90) if launch.meta.get("LANE_SUMS")]


# The lane order the PTX assumes for its (2 × 16) operands: lane bits 0-3 step the column (dim 1), bit 4 the row.
_LANE_ORDER = "register = [], lane = [[0, 1], [0, 2], [0, 4], [0, 8], [1, 0]], warp = []"


def _layout_of(ttgir: str, name: str) -> tuple[str, str]:
    """(kind, body) of the layout definition #name = #ttg.kind<{body}> in the IR."""
    m = re.search(rf"^{re.escape(name)} = #ttg\.(\w+)<\{{(.*)\}}>$", ttgir, re.M)
    assert m, f"no definition of {name}"
    return m.group(1), m.group(2)


def test_dispatcher_uses_lane_sums_for_the_benchmark_shapes():
    names = {launch.name for launch in _lane_sum_launches()}
    assert "mamba3_step_kernel[mimo4_p64_n128_bf16_large_batch]" in names       # issue 5's step
    assert "mamba3_step_kernel[mimo2_p64_n256_fp32_per_rank]" in names          # R = 2, N in tiles, per rank


@pytest.mark.parametrize("arch", CI_ARCHS)
@pytest.mark.parametrize("launch", _lane_sum_launches(), ids=lambda launch: launch.name)
def test_lane_sum_operands_have_the_assumed_lane_order(launch, arch):
    ttgir = compile_launch(launch, arch, ir=True).ttgir
    ops = [line for line in ttgir.splitlines() if "tt.elementwise_inline_asm" in line and "shfl.sync.bfly" in line]
    assert ops, f"{launch.name}: no lane-sum PTX in the IR"
    for op in ops:
        types = re.findall(r"tensor<([0-9x]+)xf32, (#\w+)>", op.split(" : ", 1)[1])
        assert types and all(shape == "2x16" for shape, _ in types), f"{launch.name}: operand shapes {types}"
        for layout in {name for _, name in types}:
            kind, body = _layout_of(ttgir, layout)
            ok = (kind == "linear" and _LANE_ORDER in body) or (
                kind == "blocked" and "sizePerThread = [1, 1], threadsPerWarp = [2, 16], warpsPerCTA = [1, 1], "
                                      "order = [1, 0]" in body)
            assert ok, f"{launch.name} on sm_{arch}: lane-sum operands in {layout} = #ttg.{kind}<{{{body}}}>"
