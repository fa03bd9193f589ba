"""Replay a state-tracking training run step by step and stop at its first non-finite loss, gradient or parameter.

    PYTHONPATH=. python3 scripts/find_nonfinite_step.py parity --model mimo --d-model 64 --lr 2.683e-3 \\
        --steps 40000 --dt-min 0.5 --dt-max 1 --max-steps 8000 --dump hunt.pt

Takes the `train` command's options (same model, optimizer, schedule and per-step batches as `train_run`, without
validations) and checks every step (one host synchronisation per step, so slower than training). At the first
non-finite value it writes the state before that step (model, optimizer, batch, step, args) to --dump and compares
that step's loss and gradients on the run's device — packed batch (the CUDA default) and padded — with the float64
PyTorch reference on the CPU: a kernel that disagrees with a finite reference is the suspect; a reference that is
non-finite too means the optimisation itself diverged. Written to chase the NaN of the eighth session's MIMO
parity run (docs/state_tracking.md). --force-at STEP runs the comparison at STEP even if everything is finite.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F

from mamba3.tasks import data
from mamba3.tasks import train as T


def _grads(model) -> dict:
    return {n: None if p.grad is None else p.grad.detach().double().cpu() for n, p in model.named_parameters()}


def _rel_err(x, ref) -> str:
    if x is None:
        return "none"
    if not torch.isfinite(x).all():
        return f"NONFINITE({int((~torch.isfinite(x)).sum())})"
    return f"{float((x - ref).norm() / ref.norm().clamp_min(1e-300)):.2e}"


def compare_step(args, task, state, batch, device) -> None:
    """This step's loss and gradients from ``state``: packed and padded on ``device``, float64 reference on CPU."""
    grads = {}
    for name, packed in (("packed", True), ("padded", False)):
        m = T.build_model(args, task).to(device)
        m.load_state_dict(state)
        b = (data.pack(batch) if packed else batch).to(device)
        logits = T.batch_logits(m, b)
        loss = F.cross_entropy(logits, b.target)
        loss.backward()
        print(f"{device} {name}: loss {loss.item():.6g}, max |logit| {logits.abs().max().item():.4g}", flush=True)
        grads[name] = _grads(m)
    ref = T.build_model(args, task).double()
    ref.load_state_dict({k: v.cpu().double() if v.is_floating_point() else v.cpu() for k, v in state.items()})
    loss = F.cross_entropy(ref(batch.tokens, batch.query), batch.target)  # float64 logits
    loss.backward()
    print(f"cpu float64 reference (padded): loss {loss.item():.10g}", flush=True)
    for n, g in _grads(ref).items():
        if g is not None:
            print(f"  {n:36s} |ref| {float(g.norm()):.3e} finite {bool(torch.isfinite(g).all())}  "
                  f"packed {_rel_err(grads['packed'][n], g)}  padded {_rel_err(grads['padded'][n], g)}", flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="find_nonfinite_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=data.TASKS)
    T.add_train_args(p)
    p.add_argument("--max-steps", type=int, default=None,
                   help="replay at most this many steps (default and at most --steps)")
    p.add_argument("--dump", default=None, help="where to save the state before the first non-finite step")
    p.add_argument("--force-at", type=int, default=None, help="compare at this step even if all is finite")
    args = p.parse_args(argv)
    task = args.task
    args = T._finish_train_args(args, task, argv)
    device = T.resolve_device(args.device)
    torch.manual_seed(args.seed)
    model = T.build_model(args, task).to(device)
    opt = T.make_optimizer(model, args, device)
    start, end = T.parse_range(args.max_len)
    warmup = T.warmup_steps(args)
    batches = iter(T.CurriculumBatches(args, start, end, packed=False))
    packed = T.use_packing(args, device)
    t0 = time.time()
    n_steps = args.steps if args.max_steps is None else max(0, min(args.max_steps, args.steps))
    for step in range(n_steps):
        batch, max_len = next(batches)
        for g in opt.param_groups:
            g["lr"] = T.lr_at(step, args.steps, args.lr, warmup)
        before = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
        b = (data.pack(batch) if packed else batch).to(device)
        logits = T.batch_logits(model, b)
        loss = F.cross_entropy(logits, b.target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        why = None
        if not (torch.isfinite(loss) and torch.isfinite(gnorm)):
            bad = [n for n, q in model.named_parameters() if q.grad is not None and not torch.isfinite(q.grad).all()]
            why = f"loss {loss.item()}, gradient norm {gnorm.item()}; non-finite gradients: {bad}"
        else:
            opt.step()
            bad = [n for n, q in model.named_parameters() if not torch.isfinite(q).all()]
            if bad:
                why = f"non-finite parameters after the update: {bad}"
        if why is None and step == args.force_at:
            why = "--force-at"
        if why is not None:
            print(f"step {step} (lengths ≤ {max_len}): {why}", flush=True)
            if args.dump:
                torch.save({"model": before[0], "optimizer": before[1], "batch": batch, "step": step,
                            "args": {k: v for k, v in vars(args).items() if not k.startswith("_")}}, args.dump)
            compare_step(args, task, before[0], batch, device)
            return 0
        if step % 500 == 0:
            print(f"step {step} lengths ≤ {max_len}: loss {loss.item():.3g}, gradient norm {gnorm.item():.3g}, "
                  f"{time.time() - t0:.0f} s", flush=True)
    print(f"no non-finite value in {n_steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
