"""Nsight Compute's warp samples of one SISO kernel, summed per source line.

``WHAT=siso scripts/profile_kernels.sh`` leaves ``siso_b8_sass.csv``: per SASS instruction of each profiled launch,
its executions and warp-stall samples, but no source lines. This script records the same forward+backward's launches
on the CPU (``bench_siso.py --profile``'s shape and inputs; the launcher's choices for an sm_90 GPU with ``--sms``
SMs, so the scan path is taken as on the H100 / H200; launches recorded, not run), compiles the profiled launch ahead
of time with its line table (``compile_launch(..., lines=True)``) and joins the two by instruction offset. It stops
if the opcodes differ anywhere (another specialisation than the profiled one: a sign that the recorded launch is not
the profiled one).

Usage (repository root, no GPU needed; a few GB of memory for the CPU-side buffers):
    python3 scripts/ncu_source_lines.py siso_b8_sass.csv bwd_dqk_kernel [--occurrence 0] [--top 40]
``--occurrence``: which launch of that kernel in the CSV (the scan runs three times: forward, recompute, reverse).
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.bench_siso import KEYS, SHAPES  # noqa: E402
from mamba3.dispatch import DeviceSpec  # noqa: E402
from mamba3.ops.common.launch import recording  # noqa: E402
from mamba3.ops.siso import function as F  # noqa: E402
from mamba3.testing.aot import KernelLaunch, compile_launch  # noqa: E402
from mamba3.testing.inputs import siso_inputs  # noqa: E402
from mamba3.testing.sass import opcode_of, source_lines  # noqa: E402

SAMPLES = "Warp Stall Sampling (All Samples)"


def profiled_blocks(path: str, kernel: str) -> list[list[dict]]:
    """Each launch of ``kernel`` in the CSV: its rows (one per instruction) as dicts."""
    blocks, header, current = [], None, None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                current = [] if row[1] == kernel else None
                if current is not None:
                    blocks.append(current)
            elif row[0] == "Address":
                header = row
            elif current is not None:
                current.append(dict(zip(header, row)))
    return blocks


def recorded_launches(kernel: str, sms: int, shape: str) -> list[tuple]:
    """(kernel, grid, args, meta) of every launch of ``kernel`` in one forward+backward, in launch order."""
    s = next(x for x in SHAPES if x["name"] == shape)
    args = siso_inputs(bsz=s["B"], seqlen=s["T"], nheads=s["H"], ngroups=s["G"], dstate=s["N"], headdim=s["P"],
                       nangles=s["A"], dtype=torch.bfloat16)
    leaves = [args[k].detach().requires_grad_(True) for k in KEYS]
    prev = F._SPEC_OVERRIDE
    F._SPEC_OVERRIDE = DeviceSpec(name="recorded sm_90", arch=90, smem_optin=232_448, sm_count=sms)
    try:
        with recording() as rec:
            out, _ = F.siso_triton(*leaves, None, None, None, "ieee")
            out.backward(torch.ones_like(out))
    finally:
        F._SPEC_OVERRIDE = prev
    return [r for r in rec if r[0].fn.__name__ == kernel]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("kernel")
    ap.add_argument("--occurrence", type=int, default=0)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--sms", type=int, default=132, help="SM count of the profiled GPU (H100 SXM and H200: 132)")
    ap.add_argument("--shape", default="B8-T4096-H32", help="bench_siso.py's shape the profile ran")
    a = ap.parse_args()

    rows = profiled_blocks(a.csv, a.kernel)[a.occurrence]
    base = int(rows[0]["Address"], 16)
    profiled = {int(r["Address"], 16) - base: r for r in rows}
    kernel, grid, args, meta = recorded_launches(a.kernel, a.sms, a.shape)[a.occurrence]
    res = compile_launch(KernelLaunch(name=a.kernel, kernel=kernel, args=tuple(args), meta=dict(meta)), 90,
                         lines=True)
    attributed = source_lines(res.sass_lines)
    differ = [(addr, text) for addr, text, _, _ in attributed
              if addr not in profiled or opcode_of(profiled[addr]["Source"].strip()) != opcode_of(text)]
    if differ or len(attributed) != len(profiled):
        sys.exit(f"{a.kernel}: the recorded launch's SASS is not the profiled one ({len(differ)} of "
                 f"{len(attributed)} instructions differ, {len(profiled)} profiled); first: {differ[:3]}")
    executed, samples = collections.Counter(), collections.Counter()
    ops = collections.defaultdict(collections.Counter)
    for addr, text, name, line in attributed:
        r = profiled[addr]
        n = int(r["Instructions Executed"] or 0)
        executed[name, line] += n
        samples[name, line] += int(r[SAMPLES] or 0)
        ops[name, line][opcode_of(text).split(".")[0]] += n
    n_all, s_all = sum(executed.values()), sum(samples.values())
    print(f"{a.kernel} (launch {a.occurrence}, grid {grid}, {meta.get('num_warps')} warps): {len(attributed)} SASS "
          f"instructions, {n_all} warp instructions executed, {s_all} warp samples")
    print("| source line | % of samples | % of instructions | most executed opcodes |\n|---|---|---|---|")
    for key, s in samples.most_common(a.top):
        top = ", ".join(f"{op} {n / max(executed[key], 1):.0%}" for op, n in ops[key].most_common(3))
        print(f"| {key[0]}:{key[1]} | {100 * s / s_all:.1f} | {100 * executed[key] / n_all:.1f} | {top} |")


if __name__ == "__main__":
    main()
