"""Time of one state-tracking training step (the sweep's unit of work) and where it goes.

    python3 benchmarks/bench_task_step.py --out task_step.json [--d-models 32,64] [--len 160] [--steps 60]

For each d_model and batching: the classifier of ``mamba3.tasks`` for ``--task`` (parity: 1 layer; arith,
arith_brackets: 3 layers with MLP blocks; d_state 64, headdim 16, fp32; other options of ``python -m mamba3
train`` are passed on, e.g. ``--a-activation softplus --outproj-norm``) on one batch of the curriculum's last
stage (256 rows of lengths uniform in [3, ``--len``]), padded (``--pack no``) or packed into one varlen sequence
with host cu_seqlens (``--pack yes``, the CUDA default), trained for ``--steps`` steps as ``train_run`` does (its
model and optimizer: AdamW fused on CUDA; clipping). Reports wall ms/step with the host queueing ahead (no
synchronisation inside the loop), the GPU's busy time per step, and the 12 largest CUDA kernels of one profiled
step. Wall ≫ GPU busy means launch-bound (runs can share the GPU); wall ≈ GPU busy means
the kernels bound the sweep. ``--chunks auto,32,16`` also times the SISO kernels at other chunk sizes (the
task model's heads are small: P = 16, N = 64). benchmarks/results/task_step_h200.* was run with
``--chunks auto,32``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_results  # noqa: E402
from mamba3.tasks import data, train  # noqa: E402


def siso_config_with_chunk(chunk: int | None, d_state: int, headdim: int):
    """The dispatcher's fp32 SISO config for the task model's heads on this GPU, with another chunk size."""
    from mamba3.dispatch import device_spec
    from mamba3.ops.siso.configs import SisoProblem, choose_config

    return choose_config(device_spec(), SisoProblem("fp32", d_state, headdim, chunk_size=chunk))


def one_config(d_model: int, length: int, steps: int, batch: int, variant: str, packed: bool,
               chunk: int | None, task: str = "parity", train_args: list[str] = ()) -> dict:
    import mamba3.ops.siso.function as siso_fn

    dev = torch.device("cuda")
    # TaskModel's layers ignore chunk_size (the dispatcher chooses): force the SISO kernels' config instead
    siso_fn._CONFIG_OVERRIDE = None if chunk is None else siso_config_with_chunk(chunk, 64, 16)
    # the model and optimizer as `python -m mamba3 train TASK` builds them (Δ init [0.5, 1] unless train_args say)
    targs = train.train_args(task, ["--d-model", str(d_model), "--model", variant, "--dt-min", "0.5", "--dt-max",
                                    "1.0", *train_args])
    torch.manual_seed(0)
    model = train.build_model(targs, task).to(dev)
    opt = train.make_optimizer(model, targs, dev)
    g = torch.Generator().manual_seed(0)
    b = data.sample_batch(task, batch, 3, length, g, targs.mult)
    tokens_per_step = int((b.query + 1).sum()) if packed else b.tokens.numel()
    b = (data.pack(b) if packed else b).to(dev)
    args = (b.tokens, b.query, b.cu_seqlens) if packed else (b.tokens, b.query)

    def step():
        logits = model(*args).float()
        loss = F.cross_entropy(logits, b.target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(5):  # compile + warm-up
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps * 1e3
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    kern, busy, launches = {}, 0.0, 0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", 0) or 0
        if t and e.device_type == torch.autograd.DeviceType.CUDA:
            kern[e.key[:70]] = round(t / 3e3, 4)
            busy += t / 3e3
            launches += e.count
    top = dict(sorted(kern.items(), key=lambda kv: -kv[1])[:12])
    siso_fn._CONFIG_OVERRIDE = None
    return {"task": task, "layers": targs.layers, "variant": variant, "d_model": d_model, "chunk": chunk or "auto",
            "max_length": length,
            "batching": "packed" if packed else "padded", "tokens_per_step": tokens_per_step, "batch": batch,
            "wall_ms_per_step": wall,
            "gpu_busy_ms_per_step": busy, "kernels_per_step": launches / 3, "top_kernels_ms": top}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="task_step.json")
    ap.add_argument("--d-models", default="32,64")
    ap.add_argument("--variants", default="mamba3")
    ap.add_argument("--len", type=int, default=160)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--chunks", default="auto", help="SISO chunk sizes to time, e.g. auto,32,16 (auto: the "
                                                       "dispatcher's choice)")
    ap.add_argument("--task", default="parity", help="parity (1 layer), arith or arith_brackets (3 layers)")
    a, train_args = ap.parse_known_args()  # other options: `python -m mamba3 train`'s (e.g. --a-activation softplus)
    rows = []
    for variant in a.variants.split(","):
        chunks = [None if c == "auto" else int(c) for c in a.chunks.split(",")]
        grid = [(int(x), c, p) for x in a.d_models.split(",") for c in chunks for p in (False, True)]
        for d, chunk, packed in grid:
            r = one_config(d, a.len, a.steps, a.batch, variant, packed, chunk, a.task, train_args)
            rows.append(r)
            print(f"{variant} d{d} chunk {r['chunk']} {r['batching']} len ≤ {a.len}: wall "
                  f"{r['wall_ms_per_step']:.2f} ms/step, GPU busy {r['gpu_busy_ms_per_step']:.2f} ms, "
                  f"{r['kernels_per_step']:.0f} kernels/step", flush=True)
            for k, v in r["top_kernels_ms"].items():
                print(f"    {v:8.4f} ms  {k}")
    cols = ["task", "layers", "variant", "d_model", "chunk", "max_length", "batching", "tokens_per_step", "batch",
            "wall_ms_per_step",
            "gpu_busy_ms_per_step", "kernels_per_step"]
    top = {f"{r['variant']} d{r['d_model']} c{r['chunk']} {r['batching']}": r["top_kernels_ms"] for r in rows}
    options = "".join(f", {x}" for x in train_args)
    write_results(a.out, f"State-tracking training step ({a.task}, fp32{options})",
                  [{c: r[c] for c in cols} for r in rows], {"top_kernels_ms": top, "train_args": train_args})


if __name__ == "__main__":
    main()
