"""Sweep SISO kernel configurations on the current GPU (used to choose the dispatcher's defaults).

    python3 benchmarks/sweep_siso.py --out sweep.json [--shape B8|B4|B2|B1|varlen8] [--headdim 64] [--only NAME,...]

For each candidate configuration: the relative Frobenius error of the output and of every gradient against the
float64 reference on a small case (B=2, T=300, H=4, N=128, P=64, A=32, D, Z, input states: a miscompiled
configuration shows here first), then forward and forward+backward time (do_bench medians, ms) on the issue's
B=8, T=4096, H=32, N=128, P=64, A=32 shape and the per-kernel CUDA time of one forward+backward (``--headdim``:
another P, in both).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from benchmarks.bench_siso import DTYPES, SHAPES as BENCH_SHAPES, cu_seqlens, make, timed_calls  # noqa: E402
from benchmarks.common import kernel_breakdown  # noqa: E402
from mamba3.ops.siso.configs import SisoConfig  # noqa: E402

# name: (input dtype, config)
CANDIDATES = {
    # the dispatcher's tiles; the chunk-state scan as the launcher decides from the grid (function._scan_states)
    "bf16-joined-c64-w4/8": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1)),
    "bf16-joined-c64-w4/8-chunked": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_states=False)),
    # the backward kernels at 4 warps (two CTAs per SM; AOT sm_90: 1.3-1.8 KB spills) — what made MIMO's faster
    "bf16-joined-c64-w4/4": ("bf16", SisoConfig(64, 64, 64, 4, 4, 1)),
    "bf16-joined-c64-w8/4": ("bf16", SisoConfig(64, 64, 64, 8, 4, 1)),
    # bwd_dqk's head split (programs per q/k group; fp32 dq/dk partials summed on the host) fixed at 8 / 4 / 2; the
    # candidates above let the launcher choose it from the grid (siso.function._head_split; 2 at B8 T4096 on an H200)
    "bf16-joined-c64-w4/8-hs8": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, head_split=8)),
    "bf16-joined-c64-w4/8-hs4": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, head_split=4)),
    "bf16-joined-c64-w4/8-hs2": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, head_split=2)),
    # one program per group: no fp32 partials and no host sum (0.108 ms at 2 splits), 1024 programs at B8 T4096
    # (7.8 per SM, under the launcher's 8-per-SM rule, so only a fixed split runs it); a second specialisation
    "bf16-joined-c64-w4/8-hs1": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, head_split=1)),
    # the chunk states and their pass across chunks in one kernel per (sequence, head, block): one fp32 state write +
    # read less per pass, NS·H·2 programs (512 at B8 T4096, 64 at B1 T32768; the launcher's rule comes from B8-B1)
    "bf16-joined-c64-w4/8-scan": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_states=True)),
    # the scan's walks (forward, recompute, reverse) without the next chunk's table row loaded a step ahead
    # (SisoConfig.scan_prefetch 0), and with the row two steps ahead and the coefficients one (2), per walk
    "bf16-joined-c64-w4/8-pf000": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_prefetch=(0, 0, 0))),
    "bf16-joined-c64-w4/8-pf111": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_prefetch=(1, 1, 1))),
    "bf16-joined-c64-w4/8-pf222": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_prefetch=(2, 2, 2))),
    "bf16-joined-c64-w4/8-pf211": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_prefetch=(2, 1, 1))),
    "bf16-joined-c64-w4/8-pf221": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_prefetch=(2, 2, 1))),
    # the output kernel's loops over N blocks (scores, inter-chunk term) not unrolled (11, before the forty-ninth
    # session) or one of them (SisoConfig.output_unroll; sm_90's default unrolls both two-block loops on 16-bit dots).
    # H100, alternated: output kernel 0.613-0.622 / 0.568-0.580 / 0.593-0.594 ms, (2, 2) 0.559
    "bf16-joined-c64-w4/8-unroll11": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, output_unroll=(1, 1))),
    "bf16-joined-c64-w4/8-unroll21": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, output_unroll=(2, 1))),
    "bf16-joined-c64-w4/8-unroll12": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, output_unroll=(1, 2))),
    # the forward's chunk states in fp32 where the scan runs (before SisoConfig.states16 became the default: half the
    # state traffic of the scan's stores and the output kernel's loads; bit-identical results)
    "bf16-joined-c64-w4/8-states32": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, states16=False)),
    # the thirty-seventh session's backward (both now-default flags off): per-chunk kernels on the fp32 S and dS, ⟨dSe,
    # S⟩ in bwd_dv (SisoConfig.bwd_states16), and bwd_dqk forming M∘(dY Vᵀ) itself per N block (bwd_store_a1); each
    # flag alone off. H100, B8 T4096 (thirty-eighth session, one run each): fwd+bwd both off / bwd16 only / a1 only /
    # both 6.809 / 6.715 / 6.482 / 6.394 ms
    # the chunk-parallel path (the launcher's at B1 T32768 and for unequal sequences) with the state passes' outputs in
    # fp32 (before the forty-seventh session: state_passing rewrote its fp32 buffer in place, the output kernel and
    # bwd_dv / bwd_dqk read fp32 S and dS, bwd_dv formed ⟨dSe, S⟩); -bwd32: the forward's 16-bit copy only
    "bf16-joined-c64-w4/8-chunked-states32": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_states=False, states16=False,
                                                                 bwd_states16=False)),
    "bf16-joined-c64-w4/8-chunked-bwd32": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, scan_states=False,
                                                              bwd_states16=False)),
    "bf16-joined-c64-w4/8-bwd32": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, bwd_states16=False, bwd_store_a1=False)),
    "bf16-joined-c64-w4/8-bwd32-a1": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, bwd_states16=False)),
    "bf16-joined-c64-w4/8-no-a1": ("bf16", SisoConfig(64, 64, 64, 4, 8, 1, bwd_store_a1=False)),
    # chunk 32 on 16-bit dots: C×C tiles a quarter of chunk 64's (the registers' largest tenant) for twice the
    # chunks' state traffic. H100 (forty-eighth session, siso_c32_sweep_h100.md): forward+backward 6.37 (c64) →
    # 9.33 / 9.79 ms, bwd_dv 1.42 → 3.65 / 3.75
    "bf16-joined-c32-w4/4": ("bf16", SisoConfig(32, 64, 64, 4, 4, 1)),
    "bf16-joined-c32-w4/8": ("bf16", SisoConfig(32, 64, 64, 4, 8, 1)),
    "fp32-x3-c32-b32-w4/8": ("fp32", SisoConfig(32, 32, 32, 4, 8, 1, half_dots=False, halves=True,
                                                fp32_prec="tf32x3")),
    "fp32-x3-c64-b32-w4/8": ("fp32", SisoConfig(64, 32, 32, 4, 8, 1, half_dots=False, halves=True,
                                                fp32_prec="tf32x3")),
    "fp32-x3-c64-b32p64-w4/8": ("fp32", SisoConfig(64, 32, 64, 4, 8, 1, half_dots=False, halves=True,
                                                   fp32_prec="tf32x3")),
    "fp32-x3-c64-b32p64-w4/8-scan": ("fp32", SisoConfig(64, 32, 64, 4, 8, 1, half_dots=False, halves=True,
                                                        fp32_prec="tf32x3", scan_states=True)),
    # bwd_dqk forming M∘(dY Vᵀ) and its transpose itself (SisoConfig.bwd_store_a1_fp32 off; the dispatcher's sm_90
    # tiles above): H100, 43rd session, B8 T4096 44.03 against 34.77 ms, B1 T32768 44.25 against 35.00
    "fp32-x3-c64-b32p64-w4/8-no-a1": ("fp32", SisoConfig(64, 32, 64, 4, 8, 1, half_dots=False, halves=True,
                                                         fp32_prec="tf32x3", bwd_store_a1_fp32=False)),
    # the pair tiles by two stride-2 loads and stores (SisoConfig.contiguous_halves off; the default before the
    # forty-fifth session), on sm_90's tiles and the others'. B8 T4096, forward+backward with the flag on: H200 (the
    # backward kernels still strided) 33.81 → 27.10 ms; H100 (forty-sixth session, the backward's loads contiguous
    # too, against the backward strided) 27.85 → 23.73, c32 tiles 57.25 → 41.62
    "fp32-x3-c64-b32p64-w4/8-strided": ("fp32", SisoConfig(64, 32, 64, 4, 8, 1, half_dots=False, halves=True,
                                                           fp32_prec="tf32x3", contiguous_halves=False)),
    "fp32-x3-c32-b32-w4/8-strided": ("fp32", SisoConfig(32, 32, 32, 4, 8, 1, half_dots=False, halves=True,
                                                        fp32_prec="tf32x3", contiguous_halves=False)),
    "fp32-x3-c32-b32-w4/4": ("fp32", SisoConfig(32, 32, 32, 4, 4, 1, half_dots=False, halves=True,
                                                fp32_prec="tf32x3")),
    # bwd_dqk forming M∘(dY Vᵀ) over P itself at several P blocks (SisoConfig.bwd_store_a1_blocks off): at P = 64 on
    # the other architectures' fp32 tiles (-w4/4 is their dispatcher's choice), with --headdim 128 on sm_90's. H100
    # (forty-sixth session, B8 T4096, forward+backward, on / off): 28.45 / 30.52 ms, P = 128 39.95 / 56.42
    "fp32-x3-c32-b32-w4/4-no-a1blocks": ("fp32", SisoConfig(32, 32, 32, 4, 4, 1, half_dots=False, halves=True,
                                                            fp32_prec="tf32x3", bwd_store_a1_blocks=False)),
    "fp32-x3-c64-b32p64-w4/8-no-a1blocks": ("fp32", SisoConfig(64, 32, 64, 4, 8, 1, half_dots=False, halves=True,
                                                               fp32_prec="tf32x3", bwd_store_a1_blocks=False)),
    "fp32-ieee-c32-b32-w4/8": ("fp32", SisoConfig(32, 32, 32, 4, 8, 1, half_dots=False, halves=True)),
}
# the B8 T4096 and the same 32768 tokens in fewer, longer sequences (the scan's programs: NS·H·blocks)
SHAPES = {"B8": (8, 4096), "B4": (4, 8192), "B2": (2, 16384), "B1": (1, 32768), "varlen8": (1, 32768)}
# varlen8: the 32768 tokens as bench_siso.py's eight packed sequences of unequal lengths (host cu_seqlens)
VARLEN8 = next(s["seqlens"] for s in BENCH_SHAPES if "seqlens" in s)
EXACT_SPLIT = {"bf16-joined-c64-w4/8-hs8", "bf16-joined-c64-w4/8-hs4", "bf16-joined-c64-w4/8-hs2",
               "bf16-joined-c64-w4/8-hs1"}


@contextlib.contextmanager
def forced(cfg, exact_split):
    """Every SISO call inside runs ``cfg``; with ``exact_split`` bwd_dqk takes ``cfg.head_split`` itself (a device
    spec without an SM count: the launcher does not reduce the split for a full grid)."""
    import mamba3.ops.siso.function as F
    from mamba3.dispatch import device_spec

    F._CONFIG_OVERRIDE = cfg
    if exact_split:
        F._SPEC_OVERRIDE = dataclasses.replace(device_spec(), sm_count=None)
    try:
        yield
    finally:
        F._CONFIG_OVERRIDE = None
        F._SPEC_OVERRIDE = None


def accuracy(cfg, dtype, exact_split=False, headdim=64):
    from mamba3.ops.siso.check import make_case, siso_kernel
    from mamba3.reference import siso_chunked
    from mamba3.testing.compare import compare

    args = make_case(dtype=dtype, B=2, T=300, H=4, G=1, N=128, P=headdim, A=32, states=True, device="cuda")
    with forced(cfg, exact_split):
        errs = compare(siso_kernel(cfg.chunk), siso_chunked, args)
    return {k: float(v) for k, v in errs.items()}


def timing(cfg, shape, dtype, exact_split=False):
    fwd, fwdbwd, leaves = timed_calls(make(shape, dtype), cu_seqlens(shape))
    with forced(cfg, exact_split):
        with torch.no_grad():
            tf = do_bench(fwd, warmup=10, rep=100)
        tb = do_bench(fwdbwd, warmup=5, rep=60, grad_to_none=leaves)
        br = kernel_breakdown(fwdbwd, leaves)
    return {"fwd_ms": tf, "fwdbwd_ms": tb, "kernels": {k: v for k, v in br.items() if "kernel" in k}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="B8", choices=list(SHAPES))
    ap.add_argument("--headdim", type=int, default=64, help="P of the timed shape and the accuracy case")
    ap.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    a = ap.parse_args()
    shape = dict(B=SHAPES[a.shape][0], T=SHAPES[a.shape][1], H=32, G=1, N=128, P=a.headdim, A=32)
    if a.shape == "varlen8":
        shape["seqlens"] = VARLEN8
    names = a.only.split(",") if a.only else list(CANDIDATES)
    res = []
    for name in names:
        dt, cfg = CANDIDATES[name]
        r = {"name": name, "dtype": dt, "headdim": a.headdim, "config": cfg.as_dict()}
        try:
            r["errors"] = accuracy(cfg, DTYPES[dt], name in EXACT_SPLIT, a.headdim)
            r.update(timing(cfg, shape, DTYPES[dt], name in EXACT_SPLIT))
        except Exception as e:  # a config that fails to compile or launch is a result too
            r["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        res.append(r)
        print(json.dumps(r), flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
