"""``mamba3.testing.sass`` on a kernel whose schedule is known: the tool the SASS maps in docs/performance.md were
read with (loops, and where in a loop's body given instructions issue)."""

import os

import pytest
import torch
import triton
import triton.language as tl

from mamba3.testing.aot import KernelLaunch, compile_launch
from mamba3.testing.sass import instructions, loops, opcode_of, positions, source_lines

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)


@triton.jit
def _scale_rows(X, Y, n_rows, BLOCK: tl.constexpr):
    """One loop over rows: a 16-byte load, a multiply, a 16-byte store per thread and row."""
    cols = tl.arange(0, BLOCK)
    for row in range(n_rows):
        x = tl.load(X + row * BLOCK + cols)
        tl.store(Y + row * BLOCK + cols, x * 3.0)


def _sass():
    x = torch.empty(64 * 512, dtype=torch.float32)
    launch = KernelLaunch(name="scale_rows", kernel=_scale_rows, args=(x, torch.empty_like(x), 64),
                          meta=dict(BLOCK=512, num_warps=4, num_stages=1))
    return compile_launch(launch, 90, sass=True).sass


def test_loops_and_positions():
    sass = _sass()
    addresses = [a for a, _ in instructions(sass)]
    assert addresses and addresses == sorted(addresses)
    found = loops(sass)
    # ptxas unrolls the row loop (sm_90, ptxas of Triton 3.6: by 4) and keeps a remainder loop of one row
    assert 1 <= len(found) <= 2, [len(x.body) for x in found]
    for loop in found:
        assert loop.start < loop.end
        assert positions(loop, "BRA") == [len(loop.body) - 1]  # predicated (@!P1 / @P0) backward branch last
        # 512 fp32 columns over 128 threads: one 16-byte load and one 16-byte store per thread and row, each row's
        # four multiplies between its load and its store
        loads, stores, muls = positions(loop, "LDG"), positions(loop, "STG"), positions(loop, "FMUL")
        assert loads and len(loads) == len(stores) and len(muls) == 4 * len(loads), loop.body
        for i, (ld, st) in enumerate(zip(loads, stores)):
            assert ld < min(muls[4 * i:4 * i + 4]) and max(muls[4 * i:4 * i + 4]) < st, loop.body
        assert positions(loop, "LDG.E.128") == loads  # a dotted opcode matches itself and as a prefix
        assert positions(loop, "LDG.E.64") == []


def test_source_lines():
    """``compile_launch(..., lines=True)`` and ``source_lines``: every instruction of the disassembly (same address
    and opcode), under the line of ``_scale_rows`` it came from: the loads on the load's line, the multiplies and stores
    on the store's."""
    import inspect

    x = torch.empty(64 * 512, dtype=torch.float32)
    launch = KernelLaunch(name="scale_rows", kernel=_scale_rows, args=(x, torch.empty_like(x), 64),
                          meta=dict(BLOCK=512, num_warps=4, num_stages=1))
    res = compile_launch(launch, 90, sass=True, lines=True)
    attributed = source_lines(res.sass_lines)
    # (nvdisasm names branch targets by label where cuobjdump prints addresses: compare the opcodes)
    assert [(a, opcode_of(t)) for a, t, _, _ in attributed] == [(a, opcode_of(t)) for a, t in instructions(res.sass)]
    src, first = inspect.getsourcelines(_scale_rows.fn)
    load_line = first + next(i for i, t in enumerate(src) if "tl.load" in t)
    store_line = first + next(i for i, t in enumerate(src) if "tl.store" in t)
    by_op = {}
    for _, text, name, line in attributed:
        assert name == os.path.basename(__file__), name
        by_op.setdefault(opcode_of(text), set()).add(line)
    assert {ln for op, lines in by_op.items() if op.startswith("LDG") for ln in lines} == {load_line}, by_op
    assert {ln for op, lines in by_op.items() if op.startswith(("FMUL", "STG")) for ln in lines} == {store_line}, by_op
