"""Torch ops per state-tracking training step on the Triton path, counted on a CPU machine (no GPU needed).

    python3 benchmarks/host_ops_task_step.py [--task arith_brackets] [--d-model 64] [--len 160] [--out ops.json]

The sweeps' training steps are launch-bound (``benchmarks/results/task_step_h200.md``: wall ≫ GPU busy), so the
number of torch ops a step dispatches, nearly all of which launch a kernel on CUDA, is what the host and the
GPU's front end pay per step. This counts them for the task model as ``train_run`` trains it on CUDA (packed
batch with host cu_seqlens, the Triton operators, clipping, AdamW) on CPU tensors: Triton runs in interpreter
mode with every kernel launch replaced by a no-op (the kernels' outputs are left as allocated; the counts do not
depend on values), and a TorchDispatchMode records each aten op with the first mamba3 source line on the Python
stack that issued it (ops of autograd's built-in backward formulas have none: "autograd"). View and metadata ops
(no kernel on CUDA) are counted apart. Not counted: the Triton launches themselves (listed separately), and what
differs on CUDA (clipping's foreach norm and the fused AdamW are a few kernels there; on the CPU they loop
over the tensors, so their phase is counted apart).
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

import argparse  # noqa: E402
import collections  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ops that launch no kernel on CUDA (views, metadata, allocation without a fill)
NO_KERNEL = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "unsqueeze",
             "squeeze", "as_strided", "alias", "detach", "split", "split_with_sizes", "unbind", "chunk", "narrow",
             "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_reshape_alias", "unflatten",
             "flatten", "diagonal", "lift_fresh", "set_", "resize_", "view_as", "_local_scalar_dense"}


class OpCounter(TorchDispatchMode):
    """Counts aten ops by (phase, op, where): where = the first mamba3 frame (file:function) on the Python stack,
    else the first torch frame below the step (e.g. torch/nn/modules/linear.py:forward), else autograd's
    built-in backward formulas."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.phase = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.phase, func.overloadpacket.__name__, _issuer()] += 1
        return func(*args, **(kwargs or {}))


def _issuer() -> str:
    f, first_torch = sys._getframe(2), None
    while f is not None:
        path = f.f_code.co_filename
        if "/mamba3/" in path and "/benchmarks/" not in path:
            return f"{Path(path).relative_to(ROOT)}:{f.f_code.co_name}"
        if "/torch/" in path and first_torch is None and not any(
                skip in path for skip in ("/utils/_python_dispatch", "/_dynamo/", "/_compile.py")):
            first_torch = f"torch/{path.split('/torch/', 1)[1]}:{f.f_code.co_name}"
        f = f.f_back
    if first_torch is None or first_torch.startswith(("torch/autograd/", "torch/_tensor.py")):
        return "autograd's built-in backward formulas"
    return first_torch


def no_op_launches() -> collections.Counter:
    """Replace every interpreted Triton launch by a no-op; the returned counter collects the launches by name."""
    from triton.runtime.interpreter import InterpretedFunction

    launches = collections.Counter()

    def run(self, *args, **kwargs):
        launches[self.fn.__name__] += 1

    InterpretedFunction.run = run
    return launches


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="arith_brackets")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--len", type=int, default=160, help="the curriculum's maximum length (rows uniform in [3, len])")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--norms", default="triton", choices=("triton", "reference"),
                   help="the RMS norms' backend (CUDA: triton; reference: the PyTorch composition they replaced)")
    p.add_argument("--time-steps", type=int, default=0,
                   help="also time this many forward+backward passes (CPU ms per step; with a small --batch and "
                        "--len this is mostly the host's dispatch work, the Triton launches excluded)")
    p.add_argument("--out", default=None, help="JSON of the counts")
    p.add_argument("--top", type=int, default=25)
    a, extra = p.parse_known_args(argv)

    from mamba3.modules import mamba3_layer, norms
    from mamba3.ops.mimo.api import mamba3_mimo
    from mamba3.ops.siso.api import mamba3_siso
    from mamba3.tasks import data, train

    launches = no_op_launches()
    # the layer's eager operators on the Triton path (CPU tensors: the interpreter's no-op launches)
    mamba3_layer.mamba3_siso = functools.partial(mamba3_siso, backend="triton")
    mamba3_layer.mamba3_mimo = functools.partial(mamba3_mimo, backend="triton")
    if a.norms == "triton":
        from mamba3.ops.rms_norm import rms_norm

        norms.rms_norm = functools.partial(rms_norm, backend="triton")
    argv_run = ["--d-model", str(a.d_model), "--device", "cpu"] + (["--layers", str(a.layers)] if a.layers else [])
    args = train.train_args(a.task, argv_run + extra)
    torch.manual_seed(0)
    model = train.build_model(args, a.task)
    opt = train.make_optimizer(model, args, torch.device("cpu"))
    batch = data.pack(data.sample_batch(a.task, a.batch, 3, a.len, torch.Generator().manual_seed(0), args.mult))

    counter = OpCounter()

    def step():
        counter.phase = "forward"
        logits = train.batch_logits(model, batch)
        loss = F.cross_entropy(logits, batch.target)
        counter.phase = "backward"
        opt.zero_grad(set_to_none=True)
        loss.backward()
        counter.phase = "clip + optimizer"
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()

    step()  # first step: the chunk tables' caches and the optimizer's state
    launches.clear()
    with counter:
        step()
    host_ms = None
    if a.time_steps:
        # forward + backward only (the CPU's clipping and AdamW are not CUDA's), no counter
        t0 = time.perf_counter()
        for _ in range(a.time_steps):
            F.cross_entropy(train.batch_logits(model, batch), batch.target).backward()
        host_ms = (time.perf_counter() - t0) / a.time_steps * 1e3
    kernels = {k: v for k, v in counter.ops.items() if k[1] not in NO_KERNEL}
    views = sum(counter.ops.values()) - sum(kernels.values())
    by_phase, by_site, by_op = collections.Counter(), collections.Counter(), collections.Counter()
    for (phase, op, site), n in kernels.items():
        by_phase[phase] += n
        if phase != "clip + optimizer":
            by_site[phase, site] += n
            by_op[op] += n
    print(f"{a.task} d_model {a.d_model}, {args.layers} layers, packed batch of {a.batch} rows ≤ {a.len} "
          f"({batch.tokens.shape[1]} tokens): torch ops that launch a kernel on CUDA: "
          + ", ".join(f"{ph} {n}" for ph, n in by_phase.items())
          + f" (+ {views} views / metadata); {sum(launches.values())} Triton launches. The CPU's clipping and "
          "AdamW loop over the tensors; on CUDA they are foreach / fused kernels (a few launches)."
          + ("" if host_ms is None else f" Forward + backward: {host_ms:.2f} ms per step on this CPU."))
    print("\n| torch ops | phase | issued from |\n|---|---|---|")
    for (phase, site), n in by_site.most_common(a.top):
        print(f"| {n} | {phase} | {site} |")
    print("\n| torch ops | op (forward + backward, all sites) |\n|---|---|")
    for op, n in by_op.most_common(a.top):
        print(f"| {n} | {op} |")
    if a.out:
        Path(a.out).write_text(json.dumps({
            "task": a.task, "d_model": a.d_model, "norms": a.norms, "train_args": extra, "layers": args.layers, "len": a.len, "batch": a.batch,
            "torch_ops_by_phase": dict(by_phase), "time_steps": a.time_steps, "fwd_bwd_ms_per_step": host_ms, "views": views, "triton_launches": dict(launches),
            "by_site": {f"{ph} | {s}": n for (ph, s), n in by_site.items()}, "by_op": dict(by_op),
            "torch": torch.__version__}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
