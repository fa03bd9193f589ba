"""Where the custom ops' forward+backward spends host time (SISO / MIMO, bf16, B=8, T=4096, H=32, N=128, P=64,
D and Z), per path (eager Functions, custom ops): the GPU time per step back to back and the host time per step
of the same 20 steps (once the launch queue is full the host waits for slots, so there host ≈ GPU time says
nothing), the host time per step of 3 steps started on an idle GPU (the host's own cost), one step under
``torch.cuda.set_sync_debug_mode("warn")`` (a synchronisation prints a warning), the CUDA runtime calls of one
profiled step (counts and host ms), and cProfile tables of 3 steps (``<out stem>_<op>_<path>_{tottime,cumtime}.txt``;
time spent under ``torch.compiler.disable``d frames is misattributed to their callers).

    PYTHONPATH=. python3 benchmarks/host_time_custom_ops.py --out host_time.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def _step(fn, call, leaves, dout):
    def step():
        out, fin = fn(**call, return_final_states=True)
        torch.autograd.grad([out, *fin], leaves, [dout, *[torch.ones_like(f) for f in fin]], allow_unused=True)
    return step


def _steady(step, n=20):
    """(GPU ms per step back to back, host ms per step) over n steps after a warm-up."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t0) * 1e3 / n
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n, host


def _host_profile(step, path):
    """The Python functions that take the host's time in 3 steps (cProfile, by own time), written to path."""
    import cProfile
    import io
    import pstats

    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3):
        step()
    pr.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(40)
        with open(f"{path}_{key}.txt", "w") as f:
            f.write(s.getvalue())


def _host_ms_from_idle(step, n=3):
    """Host ms per step for n steps started on an idle GPU (few enough launches not to fill the launch queue)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    return host


def _blocking_calls(step):
    """The CUDA runtime / driver calls of one step: count and host ms of each (synchronisations, copies, launches)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        k = e.key
        if k.startswith("cuda") or k.startswith("cu"):
            out[k] = {"count": e.count, "cpu_ms": round(e.cpu_time_total / 1e3, 4)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["cpu_ms"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import mamba3
    from mamba3.ops import custom_ops
    from mamba3.testing.inputs import mimo_inputs, siso_inputs

    shape = dict(bsz=8, seqlen=4096, nheads=32, ngroups=1, dstate=128, headdim=64, nangles=32,
                 dtype=torch.bfloat16, device="cuda", with_D=True, with_z=True)
    res = {}
    for op, make, public, custom in (("siso", siso_inputs, mamba3.mamba3_siso, custom_ops.siso),
                                     ("mimo", lambda **kw: mimo_inputs(rank=4, **kw), mamba3.mamba3_mimo,
                                      custom_ops.mimo)):
        args = make(**shape)
        leaves = {n: x.detach().requires_grad_(True) for n, x in args.items()
                  if isinstance(x, torch.Tensor) and x.is_floating_point()}
        call = dict(args, **leaves)
        dout = torch.randn_like(public(**call))
        for path, fn in (("eager", public), ("custom_op", custom)):
            step = _step(fn, call, list(leaves.values()), dout)
            gpu, host = _steady(step)
            torch.cuda.set_sync_debug_mode("warn")
            step()
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            _host_profile(step, f"{a.out[:-5]}_{op}_{path}")
            res[f"{op}_{path}"] = {"gpu_ms_per_step": round(gpu, 3), "host_ms_per_step": round(host, 3),
                                   "host_ms_per_step_from_idle": round(_host_ms_from_idle(step), 3),
                                   "runtime_calls": _blocking_calls(step)}
            print(op, path, res[f"{op}_{path}"]["gpu_ms_per_step"], res[f"{op}_{path}"]["host_ms_per_step"],
                  res[f"{op}_{path}"]["host_ms_per_step_from_idle"],
                  json.dumps(dict(list(res[f"{op}_{path}"]["runtime_calls"].items())[:6])), flush=True)
        del args, leaves, call
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
