"""SISO Triton kernels on the issue's H200 shapes: forward and forward+backward times, cold compile time,
achieved HBM bandwidth and tensor-core throughput against ceilings measured in the same run.

    python3 benchmarks/bench_siso.py --out results/siso.json      # also writes results/siso.md

Times are triton.testing.do_bench medians (ms). Byte counts are the minimum traffic of each pass (inputs read
once, outputs written once, chunk states written/read as the kernels do); FLOPs count the dots the kernels run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

# cold compile must not hit a warm cache: a private, empty cache for this process
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="mamba3-bench-cache-"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from benchmarks.common import ceilings, kernel_breakdown  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

SHAPES = [
    dict(name="B8-T4096-H32", B=8, T=4096, H=32, G=1, N=128, P=64, A=32),
    dict(name="B1-T32768-H32", B=1, T=32768, H=32, G=1, N=128, P=64, A=32),
    # fp32 inputs (the fp32-operand tf32x3 path); no target in the issue, timed so that its speed is known
    dict(name="B8-T4096-H32-fp32", B=8, T=4096, H=32, G=1, N=128, P=64, A=32, dtype="fp32"),
    # the same 32768 tokens as eight packed sequences of unequal lengths (cu_seqlens; none a multiple of the chunk
    # but the last two): what varlen training runs, on the chunk-parallel states (the launcher's choice there)
    dict(name="varlen8-T32768-H32", B=1, T=32768, H=32, G=1, N=128, P=64, A=32,
         seqlens=(1000, 7000, 3000, 5500, 2268, 6000, 4000, 4000)),
    # mamba3_siso(save_states=True): the backward on the forward's 16-bit chunk states (268 MB more held from forward
    # to backward at either shape) instead of computing them again
    dict(name="B8-T4096-H32-save_states", B=8, T=4096, H=32, G=1, N=128, P=64, A=32, save_states=True),
    dict(name="B1-T32768-H32-save_states", B=1, T=32768, H=32, G=1, N=128, P=64, A=32, save_states=True),
]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
KEYS = ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "angles", "D", "z")  # siso_triton's tensors
TARGETS = {"fwd_ms": 0.65, "fwdbwd_ms": 2.2}


def make(shape, dtype=torch.bfloat16):
    from mamba3.testing.inputs import siso_inputs

    a = siso_inputs(bsz=shape["B"], seqlen=shape["T"], nheads=shape["H"], ngroups=shape["G"], dstate=shape["N"],
                    headdim=shape["P"], nangles=shape["A"], dtype=dtype, device="cuda")
    return a


def cu_seqlens(shape):
    """The packed sequences' boundaries of a ``seqlens`` shape (int32 on the host, as a training loop that knows
    them passes them: the launcher reads them without a device sync), else None."""
    if "seqlens" not in shape:
        return None
    assert shape["B"] == 1 and sum(shape["seqlens"]) == shape["T"], shape
    return torch.tensor((0,) + shape["seqlens"]).cumsum(0).to(torch.int32)


def traffic(shape, chunk, dtype_bytes=2):
    B, T, H, G, N, P, A = (shape[k] for k in "B T H G N P A".split())
    tok = B * T
    nch = sum(triton.cdiv(n, chunk) for n in shape.get("seqlens", (T,) * B))
    inp = tok * (2 * G * N + 2 * H * P + H * A) * dtype_bytes + tok * H * 3 * 4  # q,k,v,z,angles + adt,dt,trap
    out = tok * H * P * dtype_bytes
    states = nch * H * P * N * 4
    fwd_bytes = inp + out + 4 * states  # chunk_state write, state pass read+write, output read
    # flops of the forward dots: chunk states 2·C·P·N per chunk, output Q̃K̃ᵀ 2C²N, Q̃Sᵀ 2CPN, (M)V 2C²P
    fwd_flops = nch * H * (2 * chunk * P * N + 2 * chunk * chunk * N + 2 * chunk * P * N + 2 * chunk * chunk * P)
    bwd_bytes = 2 * inp + out + 3 * tok * H * P * dtype_bytes + 10 * states  # rough: recompute + dS pass + grads
    bwd_flops = 3 * fwd_flops + nch * H * (2 * chunk * P * N)  # recompute + dS + dv + dqk dots
    return fwd_bytes, fwd_flops, fwd_bytes + bwd_bytes, fwd_flops + bwd_flops


def timed_calls(args, cu=None, save_states=False):
    """(fwd, fwdbwd, leaves): the forward and the forward+backward of siso_triton on an inputs dict (the
    dispatcher's configuration unless ``function._CONFIG_OVERRIDE`` is set; ``cu``: cu_seqlens; ``save_states``:
    siso_triton's), and the leaves whose grads to clear."""
    from mamba3.ops.siso.function import siso_triton

    ins = [args[k] for k in KEYS]
    leaves = [x.detach().requires_grad_(True) for x in ins]
    do = torch.randn_like(args["v"])

    def fwd():
        return siso_triton(*ins, None, None, cu, "ieee")

    def fwdbwd():
        out, _ = siso_triton(*leaves, None, None, cu, "ieee", save_states=save_states)
        out.backward(do)

    return fwd, fwdbwd, leaves


def bench_shape(shape, ceil):
    from mamba3.ops.siso.configs import choose_config, problem_for
    from mamba3.ops.siso.function import _spec

    dt = shape.get("dtype", "bf16")
    args = make(shape, DTYPES[dt])
    cfg = choose_config(_spec(args["v"]), problem_for(args["q"], args["v"], None))
    fwd, fwdbwd, leaves = timed_calls(args, cu_seqlens(shape), shape.get("save_states", False))
    res = {"shape": shape, "config": cfg.as_dict()}
    with torch.no_grad():
        res["fwd_ms"] = do_bench(fwd, warmup=25, rep=200)
    res["fwdbwd_ms"] = do_bench(fwdbwd, warmup=25, rep=200, grad_to_none=leaves)
    fb, ff, tb, tf = traffic(shape, cfg.chunk, dtype_bytes=2 if dt == "bf16" else 4)
    res["fwd_GBps"] = fb / (res["fwd_ms"] * 1e-3) / 1e9
    res["fwd_TFLOPs"] = ff / (res["fwd_ms"] * 1e-3) / 1e12
    res["fwdbwd_GBps"] = tb / (res["fwdbwd_ms"] * 1e-3) / 1e9
    res["fwdbwd_TFLOPs"] = tf / (res["fwdbwd_ms"] * 1e-3) / 1e12
    res["fwd_bw_frac"] = fb / (res["fwd_ms"] * 1e-3) / (ceil["copy_TBps"] * 1e12)
    res["fwd_tc_frac"] = ff / (res["fwd_ms"] * 1e-3) / (ceil["bf16_matmul_TFLOPs"] * 1e12)
    res["targets"] = TARGETS
    res["kernels_fwdbwd_ms"] = kernel_breakdown(fwdbwd, leaves)
    return res


def cold_compile():
    """First forward+backward in this process (empty Triton cache): compiles every SISO kernel."""
    from mamba3.ops.siso.function import siso_triton

    shape = dict(B=1, T=512, H=4, G=1, N=128, P=64, A=32)
    args = make(shape)
    leaves = [args[k].detach().requires_grad_(True) for k in KEYS]
    torch.cuda.synchronize()
    t = time.perf_counter()
    out, fs = siso_triton(*leaves, None, None, None, "ieee")
    out.float().sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="JSON path; a .md table is written beside it")
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--profile", action="store_true",
                    help="only run the B=8 T=4096 bf16 forward+backward three times (no timing, no results): for a "
                         "profiler (scripts/profile_kernels.sh)")
    a = ap.parse_args()
    if a.profile:
        _fwd, fwdbwd, _leaves = timed_calls(make(SHAPES[0]))
        for _ in range(3):
            fwdbwd()
        torch.cuda.synchronize()
        return
    if not a.out:
        ap.error("--out is required unless --profile")
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "cuda": torch.version.cuda,
    }
    res = {"info": info}
    res["cold_compile_s"] = cold_compile()
    res["ceilings"] = ceilings()
    res["shapes"] = [bench_shape(s, res["ceilings"]) for s in SHAPES if a.shapes == "all" or s["name"] in a.shapes]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    c = res["ceilings"]
    lines = [f"# SISO Triton benchmark ({info['device']})", "",
             f"{info['date']} · torch {info['torch']} · triton {info['triton']} · CUDA {info['cuda']}", "",
             f"Ceilings measured in this run: device-to-device copy {c['copy_TBps']:.2f} TB/s, "
             f"bf16 matmul {c['bf16_matmul_TFLOPs']:.0f} TFLOP/s. Cold compile (first fwd+bwd, empty cache): "
             f"{res['cold_compile_s']:.1f} s.", "",
             "| shape (bf16 unless named, G=1, N=128, P=64, A=32, D, Z) | fwd ms | fwd+bwd ms | fwd GB/s (% copy) | fwd TFLOP/s (% bf16 mm) | fwd+bwd TFLOP/s | target fwd / fwd+bwd |",
             "|---|---|---|---|---|---|---|"]
    for r in res["shapes"]:
        lines.append(f"| {r['shape']['name']} | {r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | {r['fwd_GBps']:.0f} "
                     f"({100 * r['fwd_bw_frac']:.0f}%) | {r['fwd_TFLOPs']:.1f} ({100 * r['fwd_tc_frac']:.1f}%) | "
                     f"{r['fwdbwd_TFLOPs']:.1f} | ≤ {TARGETS['fwd_ms']} / ≤ {TARGETS['fwdbwd_ms']} |")
    md = os.path.splitext(a.out)[0] + ".md"
    with open(md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
