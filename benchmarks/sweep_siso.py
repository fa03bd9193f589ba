"""Sweep SISO kernel configurations on the current GPU (used to choose the dispatcher's defaults).

    python3 benchmarks/sweep_siso.py --out sweep.json

For each candidate configuration: forward and forward+backward time (do_bench medians, ms) on the issue's
B=8, T=4096, H=32, N=128, P=64, A=32 bf16 shape, and the per-kernel CUDA time of one forward+backward.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from benchmarks.bench_siso import make  # noqa: E402
from benchmarks.common import kernel_breakdown  # noqa: E402


def run(cfg, shape, A=None):
    import mamba3.ops.siso.function as F

    shape = dict(shape)
    if A is not None:
        shape["A"] = A
    args = make(shape)
    keys = ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "angles", "D", "z")
    ins = [args[k] for k in keys]
    leaves = [x.detach().requires_grad_(True) for x in ins]
    do = torch.randn_like(args["v"])
    F._CONFIG_OVERRIDE = cfg
    try:
        def fwd():
            return F.siso_triton(*ins, None, None, None, "ieee")

        def fwdbwd():
            out, _ = F.siso_triton(*leaves, None, None, None, "ieee")
            out.backward(do)

        with torch.no_grad():
            tf = do_bench(fwd, warmup=10, rep=100)
        tb = do_bench(fwdbwd, warmup=5, rep=60, grad_to_none=leaves)
        br = kernel_breakdown(fwdbwd, leaves)
    finally:
        F._CONFIG_OVERRIDE = None
    return {"fwd_ms": tf, "fwdbwd_ms": tb, "kernels": {k: v for k, v in br.items() if "kernel" in k}}


def main():
    from mamba3.ops.siso.configs import SisoConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="B8")
    a = ap.parse_args()
    shape = dict(B=8, T=4096, H=32, G=1, N=128, P=64, A=32) if a.shape == "B8" else \
        dict(B=1, T=32768, H=32, G=1, N=128, P=64, A=32)
    variants = [
        SisoConfig(chunk=64, bn=64, bp=64, warps_chunk=4, warps_bwd=8, stages=1),   # the current default
        SisoConfig(chunk=64, bn=64, bp=64, warps_chunk=8, warps_bwd=8, stages=1),
        SisoConfig(chunk=64, bn=64, bp=64, warps_chunk=4, warps_bwd=4, stages=1),
        SisoConfig(chunk=64, bn=32, bp=64, warps_chunk=4, warps_bwd=4, stages=1),
        SisoConfig(chunk=64, bn=64, bp=32, warps_chunk=4, warps_bwd=8, stages=1),
        SisoConfig(chunk=32, bn=64, bp=64, warps_chunk=4, warps_bwd=4, stages=1),
        SisoConfig(chunk=32, bn=64, bp=64, warps_chunk=2, warps_bwd=4, stages=1),
        SisoConfig(chunk=32, bn=32, bp=64, warps_chunk=4, warps_bwd=4, stages=1),
        SisoConfig(chunk=64, bn=64, bp=64, warps_chunk=4, warps_bwd=8, stages=1, state_block=512),
        SisoConfig(chunk=64, bn=64, bp=64, warps_chunk=4, warps_bwd=8, stages=1, state_block=1024),
    ]
    res = []
    for i, cfg in enumerate(variants):
        r = {"config": cfg.as_dict(), **run(cfg, shape)}
        res.append(r)
        print(json.dumps(r), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
