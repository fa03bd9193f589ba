"""Training throughput of a state-tracking sweep on one GPU: JOBS training processes side by side.

    python3 benchmarks/bench_sweep_throughput.py --out sweep_throughput.json [--jobs 8] [--d-model 64]
    bash scripts/with_mps.sh python3 benchmarks/bench_sweep_throughput.py --out sweep_throughput_mps.json

Starts ``--jobs`` runs of ``python -m mamba3 train TASK`` at once (seeds 0, 1, …; lengths fixed at the
curriculum's last stage, ``--len``, where the sweeps spend their slowest steps), each validating every
``--every`` steps on a small set, and reads the step rate of each run from its results.json history: steps
between its first and last validation over the time between them, so start-up and the cold compile before the
first validation are left out. The sum over runs is the sweep's throughput. Whether the processes ran under CUDA's
Multi-Process Service (scripts/with_mps.sh) is recorded (``mps``): without it the GPU time-slices between the
processes' contexts, under it their kernels can run side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_results  # noqa: E402


def run_rate(results_json: Path) -> dict:
    hist = json.loads(results_json.read_text())["history"]
    first, last = hist[0], hist[-1]
    return {"steps_timed": last["step"] - first["step"],
            "steps_per_s": (last["step"] - first["step"]) / (last["time_s"] - first["time_s"])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="results JSON (a markdown table is written beside it)")
    p.add_argument("--task", default="arith_brackets")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--len", type=int, default=160, help="every training string's maximum length")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=100, help="validation period (the rate is timed between them)")
    p.add_argument("--device", default="auto")
    a, extra = p.parse_known_args(argv)
    if a.steps < 2 * a.every:
        p.error("--steps must be at least twice --every (the rate is timed between the first and last validation)")
    mps = "CUDA_MPS_PIPE_DIRECTORY" in os.environ
    with tempfile.TemporaryDirectory(prefix="sweep_throughput_") as tmp:
        procs = []
        t0 = time.time()
        for seed in range(a.jobs):
            cmd = [sys.executable, "-m", "mamba3", "train", a.task, "--d-model", str(a.d_model), "--steps",
                   str(a.steps), "--max-len", f"{a.len}:{a.len}", "--stages", "1", "--eval-every", str(a.every),
                   "--n-val", "64", "--n-test", "64", "--test-lens", str(a.len), "--seed", str(seed), "--device",
                   a.device, "--quiet", "--out", str(Path(tmp) / f"run{seed}")] + extra
            procs.append(subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL))
        codes = [q.wait() for q in procs]
        wall = time.time() - t0
        if any(codes):
            raise SystemExit(f"training processes failed: exit codes {codes}")
        rows = [{"seed": s, **run_rate(Path(tmp) / f"run{s}" / "results.json")} for s in range(a.jobs)]
    total = sum(r["steps_per_s"] for r in rows)
    extra_info = {"task": a.task, "jobs": a.jobs, "d_model": a.d_model, "len": a.len, "mps": mps,
                  "extra_args": " ".join(extra), "total_steps_per_s": total, "wall_s": wall}
    write_results(a.out, f"{a.task}: {a.jobs} training runs side by side ({'with' if mps else 'without'} MPS)",
                  rows, extra_info)
    each = ", ".join(f"{r['steps_per_s']:.1f}" for r in rows)
    print(f"{a.jobs} runs {'with' if mps else 'without'} MPS: {total:.1f} steps/s in all ({each}), {wall:.0f} s wall")


if __name__ == "__main__":
    main()
