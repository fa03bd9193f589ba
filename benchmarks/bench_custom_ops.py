"""Forward+backward through the torch custom ops (``mamba3::siso`` / ``mamba3::mimo`` and their backward ops: what a
``torch.compile``d model runs) against the eager autograd Functions, SISO and MIMO, bf16, B=8, T=4096, H=32, N=128,
P=64 (MIMO R=4), with D and Z. SISO's backward op calls the Triton backward directly; MIMO's replays the forward for
its gradients (``mamba3/ops/common/replay.py``), so MIMO's difference of the two columns is what the replay costs.
Also writes the per-kernel CUDA time of one call of each path (``<out>_kernels.json``).

    PYTHONPATH=. python3 benchmarks/bench_custom_ops.py --out benchmarks/results/custom_ops_h200.json
"""
from __future__ import annotations

import argparse
import json

import torch


def _timings(public, op, args, names):
    """(eager fwd+bwd, custom-op fwd+bwd) in ms, and the per-kernel CUDA time of one call of each: out and every
    final state get a gradient."""
    from benchmarks.common import bench_ms, kernel_breakdown

    leaves = {n: args[n].detach().requires_grad_(True) for n in names if args.get(n) is not None}
    call = dict(args, **leaves)

    def run(fn):
        def step():
            out, fin = fn(**call, return_final_states=True)
            torch.autograd.grad([out, *fin], list(leaves.values()), [dout, *[torch.ones_like(f) for f in fin]],
                                allow_unused=True)
        return step

    dout = torch.randn_like(public(**call))
    kernels = {"eager": kernel_breakdown(run(public), []), "custom_op": kernel_breakdown(run(op), [])}
    return bench_ms(run(public)), bench_ms(run(op)), kernels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="JSON path; a .md table and <out>_kernels.json (the per-kernel "
                                                 "times) are written beside it")
    a = ap.parse_args()

    import mamba3
    from benchmarks.common import write_results
    from mamba3.ops import custom_ops
    from mamba3.testing.inputs import mimo_inputs, siso_inputs

    shape = dict(bsz=8, seqlen=4096, nheads=32, ngroups=1, dstate=128, headdim=64, nangles=32,
                 dtype=torch.bfloat16, device="cuda", with_D=True, with_z=True)
    rows, kernels = [], {}
    s = siso_inputs(**shape)
    eager, op, kernels["siso"] = _timings(mamba3.mamba3_siso, custom_ops.siso, s,
                         ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "angles", "D", "z"))
    rows.append({"op": "siso", "eager_fwd_bwd_ms": eager, "custom_op_fwd_bwd_ms": op})
    print(rows[-1], flush=True)
    del s
    m = mimo_inputs(rank=4, **shape)
    eager, op, kernels["mimo"] = _timings(mamba3.mamba3_mimo, custom_ops.mimo, m,
                         ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "mimo_v", "mimo_z", "mimo_out",
                          "angles", "D", "z"))
    rows.append({"op": "mimo", "eager_fwd_bwd_ms": eager, "custom_op_fwd_bwd_ms": op})
    print(rows[-1], flush=True)
    write_results(a.out, "Custom ops (the torch.compile path) against eager, forward+backward", rows,
                  extra={"shape": {k: str(v) for k, v in shape.items()}})
    with open(a.out.replace(".json", "") + "_kernels.json", "w") as f:   # where the difference goes
        json.dump(kernels, f, indent=1)
    print(json.dumps(kernels), flush=True)


if __name__ == "__main__":
    main()
