"""Per-loop instruction mix of the MIMO kernels, compiled ahead of time on this machine (no GPU needed).

For each launch of the P bucket's scan configuration (optionally with ``mamba3.testing.mimo_variants`` tags), prints
registers, stack frame and shared memory per CTA, and for the largest loop of the kernel (a walk's chunk step, a
head loop) its length in SASS instructions per warp and the count of the opcodes that set its latency: global loads
and stores, wgmma / mma, barriers, shared-memory traffic (layout conversions, wgmma operands), spill traffic and
special-function instructions. Static counts: a loop body counted once, nested loops included in it.

    python scripts/sass_loops.py --arch 90 --kernels mimo_scan_out mimo_state_scan_bwd --variants walk8

(docs/performance.md, fifty-fourth session, reads these for sm_90 at bf16, N = 128, P = 64.)
"""
from __future__ import annotations

import argparse
import collections

import torch

OPCODES = ("LDG", "STG", "HGMMA", "HMMA", "BAR", "LDS", "STS", "LDL", "STL", "MUFU")


def main() -> None:
    from mamba3.ops.mimo.configs import CONFIGS
    from mamba3.ops.mimo.launch import aot_kernel_launches
    from mamba3.testing.aot import compile_launch
    from mamba3.testing.mimo_variants import OPT_IN, with_variant
    from mamba3.testing.sass import loops, opcode_of

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 86, 89, 90, 100, 120")
    ap.add_argument("--headdim", type=int, default=64, choices=sorted(CONFIGS))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--kernels", nargs="*", default=None, help="kernel name prefixes (default: every launch)")
    ap.add_argument("--variants", nargs="*", default=[], choices=sorted(OPT_IN),
                    help="variant tags, each compiled beside the plain configuration")
    args = ap.parse_args()

    base = CONFIGS[args.headdim][0]
    base = base.scan_variant() if base.scan_fwd is None else base
    dtype = getattr(torch, args.dtype)
    kernels = tuple(args.kernels) if args.kernels else None
    for cfg in [base] + [with_variant(base, tag) for tag in args.variants]:
        for launch in aot_kernel_launches(cfg, args.headdim, dtype, args.arch, kernels=kernels):
            r = compile_launch(launch, args.arch, sass=True)
            head = (f"{launch.name}: {launch.meta.get('num_warps')} warps, {r.n_regs} registers, {r.stack} B stack, "
                    f"{r.total_shared} B shared")
            body = max(loops(r.sass), key=lambda lp: len(lp.body), default=None)
            if body is None:
                print(f"{head}; no loop", flush=True)
                continue
            counts = collections.Counter(opcode_of(t).split(".")[0] for t in body.body)
            mix = ", ".join(f"{op} {counts[op]}" for op in OPCODES if counts[op])
            print(f"{head}; largest loop {len(body.body)} instructions per warp ({mix})", flush=True)


if __name__ == "__main__":
    main()
