"""Training, evaluation, the CPU demo and the GPU sweep for the state-tracking tasks (docs/state_tracking.md).

    python -m mamba3 train parity [--model mamba3|norope|fixedrope|mimo] [--d-model 32] [--layers 1] [--lr 1e-3]
                                  [--steps N] [--batch 256] [--seed 0] [--device auto|cpu|cuda] [--out DIR]
                                  [--stop-after SECONDS] [--resume]      (pause / continue a long run)
    python -m mamba3 train arith | arith_brackets ...        (3 layers by default)
    python -m mamba3 train demo [--out DIR]                   (CPU: Mamba-3 vs its no-rotation ablation, parity)
    python -m mamba3 train sweep parity [--models mamba3,norope] [--d-models 32,64] [--lrs 8] [--jobs 16]
                                        [--stop-after SECONDS] ...
    python -m mamba3 train summarize DIR                      (the results table of a sweep directory)
    python -m mamba3 train eval CHECKPOINT [...] [--lengths 256,512] [--plot PNG]   (test accuracy per length)

(also ``python -m mamba3.tasks ...``). :func:`main` is the single entry point; it accepts its arguments with or
without a leading ``train``.

Protocol (the paper's App. D where it says something, our choice where it is silent): length curriculum with the
minimum length 3 and the maximum growing in equal stages from 40 to 160 (``--max-len 40:160``, ``--stages``);
every row's length uniform in [min, max]; batch 256; AdamW (β = 0.9, 0.95; weight decay 0.1 on matrices only),
linear warm-up then cosine decay to 10 % of the peak learning rate, gradient clipping at 1.0; validation every
``--eval-every`` steps at length 256 on a fixed set, the best-validation checkpoint kept; at the end the best
checkpoint is tested on fresh sets at several lengths. Scaled accuracy = (acc − chance) / (1 − chance). A run
whose running training loss is not finite at a validation stops there and is reported from its best checkpoint
(``diverged_at_step`` in results.json).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import data
from ..modules.mamba3_layer import A_ACTIVATIONS, Mamba3
from .models import VARIANTS, TaskModel, param_groups

VAL_SEED, TEST_SEED, POOLED_SEED = 10_000, 20_000, 30_000
DEFAULT_LAYERS = {"parity": 1, "arith": 3, "arith_brackets": 3}
#: The paper's Table 5b (scaled accuracy at length 256, %) for the variants it reports; MIMO is not in it.
PAPER_TABLE_5B = {
    ("parity", "mamba3"): 100.00, ("arith", "mamba3"): 98.51, ("arith_brackets", "mamba3"): 87.75,
    ("parity", "fixedrope"): 1.56, ("arith", "fixedrope"): 20.70, ("arith_brackets", "fixedrope"): 2.62,
    ("parity", "norope"): 2.27, ("arith", "norope"): 1.49, ("arith_brackets", "norope"): 0.72,
}


# ------------------------------------------------------------------------------------------------ utilities
def versions() -> dict:
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    try:
        from mamba3 import __version__ as mv
    except ImportError:
        mv = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or None
    except Exception:
        commit = None
    return {"mamba3": mv, "git": commit, "torch": torch.__version__, "triton": tv,
            "python": platform.python_version()}


def machine(device: torch.device) -> dict:
    info = {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def parse_range(text: str) -> tuple[int, int]:
    """'40:160' → (40, 160); '64' → (64, 64)."""
    a, _, b = text.partition(":")
    return int(a), int(b or a)


def curriculum_max(step: int, steps: int, start: int, end: int, stages: int) -> int:
    """The maximum training length at ``step``: ``stages`` equal stages from ``start`` to ``end``."""
    if stages <= 1 or start == end:
        return end
    stage = min(step * stages // max(steps, 1), stages - 1)
    return int(round(start + (end - start) * stage / (stages - 1)))


def lr_at(step: int, steps: int, peak: float, warmup: int, final_frac: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(steps - warmup, 1)
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


class Progress:
    """A plain-text progress bar on stderr: redrawn in place on a terminal, one line every ~5 % otherwise."""

    def __init__(self, total: int, label: str = "", enabled: bool = True, stream=None):
        self.total, self.label, self.enabled = total, label, enabled
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.time()
        self.last_line = -1

    def update(self, done: int, info: str = ""):
        if not self.enabled:
            return
        frac = done / max(self.total, 1)
        bucket = int(frac * 20)
        if not self.tty and bucket == self.last_line and done != self.total:
            return
        self.last_line = bucket
        el = time.time() - self.t0
        eta = el / done * (self.total - done) if done else 0.0
        bar = "#" * bucket + "." * (20 - bucket)
        line = (f"{self.label} [{bar}] {done}/{self.total} {info} "
                f"{el:.0f}s elapsed, eta {eta:.0f}s")
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            if done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


@torch.no_grad()
def row_results(model, batch: data.Batch, device, eval_batch: int = 256) -> tuple[torch.Tensor, float]:
    """(whether each row's answer is right (B,) bool on the CPU, summed cross-entropy) of ``model`` on ``batch``
    (evaluated in slices of eval_batch rows)."""
    was = model.training
    model.eval()
    right, loss = [], 0.0
    for i in range(0, batch.target.numel(), eval_batch):
        sl = slice(i, i + eval_batch)
        tokens = batch.tokens[sl].to(device)
        T = int(batch.query[sl].max()) + 1
        logits = model(tokens[:, :T], batch.query[sl].to(device)).float()
        tgt = batch.target[sl].to(device)
        right.append((logits.argmax(-1) == tgt).cpu())
        loss += float(F.cross_entropy(logits, tgt, reduction="sum"))
    model.train(was)
    return torch.cat(right), loss


def evaluate(model, batch: data.Batch, device, eval_batch: int = 256) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on ``batch``."""
    return _accuracy_and_loss(*row_results(model, batch, device, eval_batch))


def _accuracy_and_loss(right: torch.Tensor, loss: float) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) from :func:`row_results`."""
    return int(right.sum()) / right.numel(), loss / right.numel()


# ------------------------------------------------------------------------------------------------ one run
class CurriculumBatches(torch.utils.data.IterableDataset):
    """The training batches of a run, step by step (batch ``step`` is drawn from its own generator, seeded by
    (seed, step), so the data do not depend on ``--workers``)."""

    def __init__(self, args, start: int, end: int, packed: bool, first_step: int = 0):
        self.args, self.start, self.end, self.packed, self.first_step = args, start, end, packed, first_step

    def __iter__(self):
        a = self.args
        for step in range(self.first_step, a.steps):
            max_len = curriculum_max(step, a.steps, self.start, self.end, a.stages)
            g = torch.Generator().manual_seed((a.seed + 1) * 1_000_003 + step)
            batch = data.sample_batch(a.task, a.batch, a.min_len, max_len, g, a.mult)
            yield (data.pack(batch) if self.packed else batch), max_len


def use_packing(args, device: torch.device) -> bool:
    """--pack auto: packed (varlen) batches on CUDA, where the kernels parallelise over chunks and skipping the
    padding (about half of a curriculum batch's tokens) saves device time; padded on the CPU, where the
    reference backend runs varlen sequences one by one."""
    return args.pack == "yes" or (args.pack == "auto" and device.type == "cuda")


def _batches(args, start: int, end: int, packed: bool, first_step: int):
    ds = CurriculumBatches(args, start, end, packed, first_step)
    if not args.workers:
        return iter(ds)
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, prefetch_factor=8,
                                            persistent_workers=False))


def make_optimizer(model, args, device: torch.device) -> torch.optim.Optimizer:
    """AdamW as the protocol says; fused (one kernel per step) on CUDA: these models are small enough for launch
    overhead to dominate. With ``args.dynamics_weight_decay`` set, the in_proj rows that produce Δ and A
    (dd_dt, dd_A) take that weight decay instead (:func:`decay_in_proj_rows`)."""
    layers = [] if args.dynamics_weight_decay is None else [m for m in model.modules() if isinstance(m, Mamba3)]
    groups = param_groups(model, args.weight_decay, exclude=[m.in_proj.weight for m in layers])
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    if layers:
        decay_in_proj_rows(opt, layers, args.weight_decay, args.dynamics_weight_decay)
    return opt


def decay_in_proj_rows(opt: torch.optim.Optimizer, layers, weight_decay: float, dynamics_weight_decay: float):
    """AdamW's decoupled weight decay, p ← p·(1 − lr·wd), on the in_proj weight of each Mamba-3 layer in ``layers``
    (which :func:`make_optimizer` left out of AdamW's decay) with one rate per row: ``dynamics_weight_decay`` on the
    rows of dd_dt and dd_A, ``weight_decay`` on the others. Applied right before each step, where AdamW applies
    its own, so ``dynamics_weight_decay == weight_decay`` trains as plain AdamW does. The reason to lower it: A =
    −heavy_tail(dd_A) nears 0 (slow forgetting) only as dd_A → −∞, and decay on those rows pulls dd_A to 0, A to −1
    (docs/state_tracking.md) — the role of Mamba-2 recipes' exemption of A_log and dt_bias."""
    blocks = []  # (weight rows, their weight decay)
    for layer in layers:
        w, rows = layer.in_proj.weight, layer.in_proj_slices()
        start, stop = rows["dd_dt"].start, rows["dd_A"].stop  # adjacent: dd_dt, then dd_A
        blocks += [(w[:start], weight_decay), (w[start:stop], dynamics_weight_decay), (w[stop:], weight_decay)]

    def before_step(optimizer, *_):
        lr = optimizer.param_groups[0]["lr"]
        with torch.no_grad():
            for rows, wd in blocks:
                rows.mul_(1.0 - lr * wd)  # as AdamW does it: a Python float factor

    opt.register_step_pre_hook(before_step)


class WeightAverage:
    """An exponential moving average of a model's parameters (Polyak averaging), updated after every optimizer step:
    avg ← decay·avg + (1 − decay)·params, starting from the initial weights (whose share after n steps is decayⁿ).
    ``model`` is a copy holding the averaged weights, evaluated and saved like the trained one; TaskModel has no
    buffers, so there is nothing else to average."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"the weight average's decay must be in [0, 1], got {decay}")
        self.decay = decay
        self.model = copy.deepcopy(model).requires_grad_(False)
        self._avg = list(self.model.parameters())

    @torch.no_grad()
    def update(self, model: torch.nn.Module):
        torch._foreach_lerp_(self._avg, [p.detach() for p in model.parameters()], 1.0 - self.decay)


def warmup_steps(args) -> int:
    return args.warmup if args.warmup is not None else max(1, min(500, args.steps // 20))


def batch_logits(model, batch) -> torch.Tensor:
    """fp32 logits at the query positions of a padded Batch or a PackedBatch (on the model's device)."""
    if isinstance(batch, data.PackedBatch):
        return model(batch.tokens, batch.query, batch.cu_seqlens).float()
    return model(batch.tokens, batch.query).float()


def build_model(args, task: str) -> TaskModel:
    return TaskModel(data.VOCAB_SIZE, data.NUM_CLASSES[task], variant=args.model, d_model=args.d_model,
                     n_layers=args.layers, d_state=args.d_state, expand=args.expand, headdim=args.headdim,
                     mlp_ratio=args.mlp_ratio, rope_fraction=args.rope_fraction, mimo_rank=args.mimo_rank,
                     dt_min=args.dt_min, dt_max=args.dt_max, a_activation=args.a_activation,
                     outproj_norm=args.outproj_norm)


def load_checkpoint(path, map_location="cpu") -> TaskModel:
    """The model stored in a checkpoint written by :func:`train_run`."""
    return model_from_checkpoint(torch.load(path, map_location=map_location, weights_only=True))


def model_from_checkpoint(ck: dict) -> TaskModel:
    """The model of a checkpoint dict already loaded (:func:`load_checkpoint` reads the file)."""
    model = TaskModel(**ck["config"])
    model.load_state_dict(ck["model"])
    return model


# What a resumed run must share with the run that wrote checkpoint_resume.pt (everything that changes the training
# or what its validations measure). Not the validation period: a validation reads the weights and changes nothing
# (each step's batch comes from its own seed), so a run may be resumed validating more often, e.g. in its last
# stage; each history entry has its step. Checkpoints written before that still hold it (left out when compared).
RESUME_KEYS = ("task", "model", "d_model", "layers", "d_state", "expand", "headdim", "mlp_ratio", "rope_fraction",
               "mimo_rank", "dt_min", "dt_max", "lr", "weight_decay", "warmup", "clip", "steps", "batch", "min_len",
               "max_len", "stages", "eval_len", "n_val", "eval_batch", "mult", "seed")
# Options added after checkpoints were first written, each with the value those checkpoints trained with: in the
# key only when set otherwise, so older checkpoints resume as they were.
LATER_RESUME_KEYS = {"dynamics_weight_decay": None, "a_activation": "heavy_tail", "outproj_norm": False,
                     "ema": None}


def is_better(val_acc: float, val_loss: float, best: dict) -> bool:
    """The selection rule: higher validation accuracy, then lower validation loss; never a non-finite loss."""
    return (val_acc, -val_loss) > (best["val_acc"], -best["val_loss"]) and math.isfinite(val_loss)


def train_run(args) -> dict | None:
    """Train one model as configured by ``args`` (the ``train`` parser's namespace); write checkpoints,
    results.json and (if matplotlib is installed) accuracy_vs_length.png under args.out; return the results.

    Resumable: with ``args.stop_after`` the run stops after that many seconds of training, writes
    ``checkpoint_resume.pt`` (model, optimizer, step, history; also written at every validation) and returns
    None; with ``args.resume`` a run continues from that file, batch for batch as if it had not stopped (every
    step's batch is drawn from its own seed)."""
    task = args.task
    device = resolve_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model = build_model(args, task).to(device)
    nparams = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, args, device)
    start, end = parse_range(args.max_len)
    warmup = warmup_steps(args)
    eval_every = args.eval_every or max(1, args.steps // 20)
    val = data.fixed_set(task, args.n_val, args.eval_len, VAL_SEED, args.mult)
    history, best = [], {"val_acc": -1.0, "val_loss": float("inf"), "step": 0}  # (replaced, never changed)
    ckpt_best, ckpt_last = out / "checkpoint_best.pt", out / "checkpoint_last.pt"
    ckpt_resume = out / "checkpoint_resume.pt"
    # --ema: the weight average is validated beside the trained weights, with its own best checkpoint and test
    avg = None if args.ema is None else WeightAverage(model, args.ema)
    best_avg = best
    ckpt_best_avg = out / "checkpoint_best_ema.pt"
    run_key = {k: getattr(args, k) for k in RESUME_KEYS}
    run_key |= {k: getattr(args, k) for k, old in LATER_RESUME_KEYS.items() if getattr(args, k) != old}
    first_step, trained_s = 0, 0.0
    run_loss = run_acc = None
    if args.resume and ckpt_resume.exists():
        ck = torch.load(ckpt_resume, map_location=device, weights_only=True)
        saved_key = {k: v for k, v in ck["run_key"].items() if k != "eval_every"}
        if saved_key != run_key:
            diff = {k: (saved_key.get(k), run_key.get(k)) for k in saved_key.keys() | run_key.keys()
                    if saved_key.get(k) != run_key.get(k)}
            raise ValueError(f"{ckpt_resume} was written by another configuration ((saved, now): {diff}); "
                             "remove it or train into another --out")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        first_step, trained_s, history, best = ck["step"], ck["trained_s"], ck["history"], ck["best"]
        if avg is not None:  # (ema is in the resume key: a checkpoint written with it holds the average)
            avg.model.load_state_dict(ck["ema_model"])
            best_avg = ck["best_ema"]
        run_loss, run_acc = ck["run_loss"], ck["run_acc"]
        if not args.quiet:
            print(f"resuming {out} at step {first_step}", file=sys.stderr, flush=True)

    def save(path, step, weights=model):
        torch.save({"model": weights.state_dict(), "config": model.config, "step": step, "task": task,
                    "args": vars(args)}, path)

    def save_resume(step):
        extra = {} if avg is None else {"ema_model": avg.model.state_dict(), "best_ema": best_avg}
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                    "trained_s": trained_s + time.time() - t0, "history": history, "best": best,
                    "run_loss": run_loss, "run_acc": run_acc, "run_key": run_key} | extra, ckpt_resume)

    label = f"{task}/{args.model} d{args.d_model} lr{args.lr:.2e}"
    bar = Progress(args.steps, label, enabled=not args.quiet)
    t0 = time.time()
    info = ""  # the progress bar's text, refreshed every 25 steps
    model.train()
    packed = use_packing(args, device)
    batches = _batches(args, start, end, packed, first_step)
    done, diverged_at = first_step, None
    for step in range(first_step, args.steps):
        batch, max_len = next(batches)
        batch = batch.to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup)
        logits = batch_logits(model, batch)
        loss = F.cross_entropy(logits, batch.target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if avg is not None:
            avg.update(model)
        # running loss/accuracy stay on the device (no host synchronisation per step, so the host queues the next
        # step while the device runs this one); read at evaluations and every 25 steps for the progress bar
        li, ai = loss.detach(), (logits.detach().argmax(-1) == batch.target).float().mean()
        run_loss = li if run_loss is None else 0.9 * run_loss + 0.1 * li
        run_acc = ai if run_acc is None else 0.9 * run_acc + 0.1 * ai
        done = step + 1
        if done % eval_every == 0 or done == args.steps:
            va, vl = evaluate(model, val, device, args.eval_batch)
            rec = {"step": done, "max_len": max_len, "lr": opt.param_groups[0]["lr"],
                   "train_loss": float(run_loss), "train_acc": float(run_acc), "grad_norm": float(gnorm),
                   "val_acc": va, "val_loss": vl, "val_scaled": data.scaled_accuracy(va, task),
                   "time_s": time.time() - t0}
            if avg is not None:
                va_avg, vl_avg = evaluate(avg.model, val, device, args.eval_batch)
                rec |= {"val_acc_ema": va_avg, "val_loss_ema": vl_avg,
                        "val_scaled_ema": data.scaled_accuracy(va_avg, task)}
                if is_better(va_avg, vl_avg, best_avg):
                    best_avg = {"val_acc": va_avg, "val_loss": vl_avg, "step": done}
                    save(ckpt_best_avg, done, avg.model)
            history.append(rec)
            if is_better(va, vl, best):
                best = {"val_acc": va, "val_loss": vl, "step": done}
                save(ckpt_best, done)
            if not math.isfinite(rec["train_loss"]):
                # NaN/inf weights never recover: stop instead of training on, and report from the best checkpoint
                diverged_at = done
                src = f"its best checkpoint, step {best['step']}" if best["step"] else "no finite validation"
                print(f"{out}: training loss not finite at step {done}; the run stops ({src})", file=sys.stderr,
                      flush=True)
                break
            if done < args.steps:
                save_resume(done)
        if bar.enabled and (done % 25 == 0 or done == 1 or done == args.steps):
            info = (f"len<={max_len} loss {float(run_loss):.3f} acc {float(run_acc):.2f}"
                    + (f" val@{args.eval_len} {history[-1]['val_acc']:.3f}" if history else ""))
        bar.update(done, info)
        if args.stop_after is not None and time.time() - t0 >= args.stop_after and done < args.steps:
            save_resume(done)
            print(f"paused {out} at step {done} of {args.steps} (--stop-after {args.stop_after:g} s); rerun with "
                  "--resume to continue", file=sys.stderr, flush=True)
            return None
    train_time = trained_s + time.time() - t0
    save(ckpt_last, done)
    ckpt_resume.unlink(missing_ok=True)

    def selected(weights, best_of: dict, path: Path) -> dict:
        """The validation-selected checkpoint ``path`` (the weights as they are if it is not this run's: a
        checkpoint of an earlier run in --out, or none) loaded into ``weights`` and tested on fresh strings."""
        if best_of["step"] and path.exists():
            weights.load_state_dict(torch.load(path, map_location=device, weights_only=True)["model"])
        test = accuracy_at_lengths(weights, task, args.test_lens + [args.eval_len], args.n_test, args.mult, device,
                                   args.eval_batch)
        # the other reading of "evaluated at 256 length" (Grazzi et al.'s protocol): one accuracy over lengths
        # uniform in [the curriculum's first maximum, eval_len] ([40, 256] for the paper's settings)
        lo = min(start, args.eval_len)
        pooled = pooled_results(weights, task, lo, args.eval_len, args.n_test, args.mult, device, args.eval_batch)
        return {"best_step": best_of["step"], "best_val_acc": best_of["val_acc"],
                "best_val_scaled": data.scaled_accuracy(best_of["val_acc"], task) if best_of["step"] else None,
                "test_scaled_at_eval_len": test[str(args.eval_len)]["scaled"], "test": test, "test_pooled": pooled}

    res = {
        "task": task, "model": args.model, "d_model": args.d_model, "layers": args.layers, "lr": args.lr,
        "seed": args.seed, "steps": args.steps, "steps_trained": done, "diverged_at_step": diverged_at,
        "batch": args.batch, "params": nparams,
        "eval_len": args.eval_len, "chance": data.chance(task),
        **selected(model, best, ckpt_best),
        **({} if avg is None else {"ema": {"decay": args.ema, **selected(avg.model, best_avg, ckpt_best_avg)}}),
        "history": history, "train_time_s": train_time,
        "wall_time_s": trained_s + time.time() - t0,
        "args": vars(args), "model_config": model.config, "versions": versions(), "machine": machine(device),
        "command": " ".join(["python -m mamba3 train", task] + getattr(args, "_argv", [])),
    }
    (out / "results.json").write_text(json.dumps(res, indent=1))
    plot_runs([res], out / "accuracy_vs_length.png", f"{task}: scaled accuracy vs evaluation length")
    return res


def rows_at_lengths(model, task: str, lengths, n: int, mult: bool, device, eval_batch: int = 256) -> dict:
    """{L: (test set, :func:`row_results` on it)} on fresh test sets of n rows per length (the i-th smallest
    length's set has seed TEST_SEED + i, so the same lengths give the same sets)."""
    out = {}
    for i, L in enumerate(sorted(set(lengths))):
        ts = data.fixed_set(task, n, L, TEST_SEED + i, mult)
        out[L] = (ts, row_results(model, ts, device, eval_batch))
    return out


def accuracy_at_lengths(model, task: str, lengths, n: int, mult: bool, device, eval_batch: int = 256) -> dict:
    """{str(L): length, accuracy, loss, scaled accuracy} on the test sets of :func:`rows_at_lengths`."""
    return length_results(task, rows_at_lengths(model, task, lengths, n, mult, device, eval_batch))


def length_results(task: str, rows: dict) -> dict:
    """accuracy_at_lengths's dict from :func:`rows_at_lengths`' results."""
    test = {}
    for L, (_, results) in rows.items():
        acc, loss = _accuracy_and_loss(*results)
        test[str(L)] = {"length": data.effective_length(task, L), "acc": acc, "loss": loss,
                        "scaled": data.scaled_accuracy(acc, task)}
    return test


def pooled_set(task: str, n: int, lo: int, hi: int, mult: bool) -> data.Batch:
    """The evaluation set of Grazzi et al.'s protocol (whose tasks the Mamba-3 paper takes; one reading of its
    "evaluated at 256 length"): n strings whose lengths are drawn uniformly from [lo, hi] (they used 8192 strings of
    lengths 40..256), one accuracy pooled over all of them; deterministic (seed POOLED_SEED)."""
    return data.sample_batch(task, n, lo, hi, torch.Generator().manual_seed(POOLED_SEED), mult)


def pooled_results(model, task: str, lo: int, hi: int, n: int, mult: bool, device, eval_batch: int = 256) -> dict:
    """Accuracy, loss and scaled accuracy of ``model`` on :func:`pooled_set`."""
    acc, loss = evaluate(model, pooled_set(task, n, lo, hi, mult), device, eval_batch)
    return {"lengths": [lo, hi], "n": n, "acc": acc, "loss": loss, "scaled": data.scaled_accuracy(acc, task)}


def run_eval(argv: list[str]) -> int:
    """``train eval CHECKPOINT [CHECKPOINT ...]``: each checkpoint's scaled accuracy per length, on the test sets of
    its run; ``--plot`` draws them against length in one figure."""
    p = argparse.ArgumentParser(prog="python -m mamba3 train eval",
                                description="Scaled test accuracy of checkpoints per evaluation length (by "
                                            "default the lengths and test sets of the run that wrote each).")
    p.add_argument("checkpoints", nargs="+", metavar="checkpoint")
    p.add_argument("--lengths", default=None, help="comma-separated lengths (default: the run's test lengths)")
    p.add_argument("--n", type=int, default=None, help="strings per length (default: the run's n_test)")
    p.add_argument("--device", default="auto")
    p.add_argument("--eval-batch", type=int, default=256)
    p.add_argument("--by-depth", action="store_true",
                   help="arith_brackets: also the scaled accuracy per deepest bracket nesting of the strings")
    p.add_argument("--pooled", default=None, metavar="MIN:MAX",
                   help="also one scaled accuracy pooled over --n strings (default: the run's n_test) of lengths "
                        "uniform in [MIN, MAX] (the protocol of Grazzi et al. 2025: 40:256)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw every checkpoint's scaled accuracy against length into this PNG")
    a = p.parse_args(argv)
    cks = [torch.load(path, map_location="cpu", weights_only=True) for path in a.checkpoints]
    tasks = {ck["task"] for ck in cks}
    if a.by_depth and tasks != {"arith_brackets"}:
        p.error(f"--by-depth needs arith_brackets checkpoints, not {', '.join(sorted(tasks))}")
    if a.plot and len(tasks) > 1:
        p.error(f"--plot draws checkpoints of one task, not {', '.join(sorted(tasks))}")
    device = resolve_device(a.device)
    pooled_range = parse_range(a.pooled) if a.pooled else None
    curves = []
    for path, ck in zip(a.checkpoints, cks):
        run, task = ck["args"], ck["task"]
        model = model_from_checkpoint(ck).to(device)
        lengths = ([int(x) for x in a.lengths.split(",")] if a.lengths else run["test_lens"] + [run["eval_len"]])
        n = a.n or run["n_test"]
        rows = rows_at_lengths(model, task, lengths, n, run["mult"], device, a.eval_batch)
        test = length_results(task, rows)
        print(f"\n{path}\n{task} · {ck['config']['variant']} d_model {ck['config']['d_model']} · "
              f"step {ck['step']} · {device.type}")
        print("| length | " + " | ".join(test) + " |\n|---|" + "---|" * len(test))
        print("| scaled accuracy (%) | " + " | ".join(f"{100 * v['scaled']:.2f}" for v in test.values()) + " |")
        if a.by_depth:
            print(accuracy_by_depth(task, rows))
        if pooled_range:
            lo, hi = pooled_range
            pooled = pooled_results(model, task, lo, hi, n, run["mult"], device, a.eval_batch)
            print(f"\nscaled accuracy pooled over {pooled['n']} strings of lengths uniform in [{lo}, {hi}]: "
                  f"{100 * pooled['scaled']:.2f} %")
        curves.append({"args": run, "test": test, "label": f"{ck['config']['variant']} d{ck['config']['d_model']} "
                       f"lr {run['lr']:.1e} seed {run['seed']}: {Path(path).stem} (step {ck['step']})"})
    if a.plot and not plot_runs(curves, a.plot, f"{tasks.pop()}: scaled test accuracy vs evaluation length"):
        print("matplotlib is not installed: no plot")
    return 0


def accuracy_by_depth(task: str, rows: dict) -> str:
    """A markdown table from :func:`rows_at_lengths`' results: per deepest bracket nesting (table rows) and length
    (columns), the scaled accuracy and the number of strings. Tells a failure to extrapolate in length from one in
    nesting depth (the deeper nestings of longer strings)."""
    cells: dict = {}
    for L, (ts, (right, _)) in rows.items():
        depth = data.nesting_depth(ts.tokens)
        for d in depth.unique().tolist():
            hit = right[depth == d]
            cells[d, L] = f"{100 * data.scaled_accuracy(int(hit.sum()) / hit.numel(), task):.1f} ({hit.numel()})"
    cols = list(rows)
    out = ["| deepest nesting | " + " | ".join(f"length {L}" for L in cols) + " |", "|---|" + "---|" * len(cols)]
    for d in sorted({d for d, _ in cells}):
        out.append(f"| {d} | " + " | ".join(cells.get((d, L), "") for L in cols) + " |")
    return "\n".join(out) + "\n\nCells: scaled accuracy (%) over the strings of that nesting depth (their number)."


def plot_runs(results: list[dict], path, title: str) -> bool:
    """Scaled test accuracy against evaluation length, one line per run (labelled by its "label", else by its
    model, variant, d_model and lr); False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        pts = sorted((v["length"], 100 * v["scaled"]) for v in r["test"].values())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label=r.get("label") or f"{r['model']}{_tag_label(r)} (d{r['d_model']}, lr {r['lr']:.1e})")
    train_max = max(parse_range(r["args"]["max_len"])[1] for r in results)
    ax.axvline(train_max, color="gray", ls="--", lw=1, label=f"longest training length ({train_max})")
    ax.set_xlabel("evaluation length")
    ax.set_ylabel("scaled accuracy (%)")
    ax.set_ylim(-10, 105)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------ CLI
def add_train_args(p: argparse.ArgumentParser, task_default_layers: bool = True):
    p.add_argument("--model", default="mamba3", choices=VARIANTS, help="model variant (default mamba3)")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--layers", type=int, default=None, help="default: 1 for parity, 3 for arithmetic")
    p.add_argument("--d-state", type=int, default=64)
    p.add_argument("--expand", type=int, default=2)
    p.add_argument("--headdim", type=int, default=16)
    p.add_argument("--mlp-ratio", type=float, default=2.0, help="SwiGLU width / d_model after each block; 0: none")
    p.add_argument("--rope-fraction", type=float, default=0.5, choices=(0.5, 1.0))
    p.add_argument("--mimo-rank", type=int, default=4)
    p.add_argument("--dt-min", type=float, default=0.001, help="Δ initialisation range (Mamba3 dt_min)")
    p.add_argument("--dt-max", type=float, default=0.1, help="Δ initialisation range (Mamba3 dt_max)")
    p.add_argument("--a-activation", default="heavy_tail", choices=sorted(A_ACTIVATIONS),
                   help="A = −activation(dd_A): heavy_tail (the official module's, default) or softplus (its "
                        "earlier form, which reaches slow forgetting at far smaller |dd_A|)")
    p.add_argument("--outproj-norm", action="store_true",
                   help="Mamba3(is_outproj_norm=True): a headwise RMSNorm of each head's output before the silu(z) "
                        "gate (the paper: helps hybrids' length generalisation)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dynamics-weight-decay", type=float, default=None,
                   help="weight decay on the in_proj rows that produce Δ and A (dd_dt, dd_A); default: --weight-decay")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default min(500, steps/20))")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--ema", type=float, default=None, metavar="DECAY",
                   help="also validate an exponential moving average of the weights (avg ← DECAY·avg + (1 − "
                        "DECAY)·weights after every step), keep its best checkpoint (checkpoint_best_ema.pt) and test "
                        "it (results.json 'ema'); the trained weights are selected and tested as without it")
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--min-len", type=int, default=3)
    p.add_argument("--max-len", default="40:160", help="curriculum maximum length START:END (default 40:160)")
    p.add_argument("--stages", type=int, default=4, help="curriculum stages from START to END (default 4)")
    p.add_argument("--eval-len", type=int, default=256)
    p.add_argument("--eval-every", type=int, default=None, help="validation period (default steps/20)")
    p.add_argument("--n-val", type=int, default=512)
    p.add_argument("--n-test", type=int, default=1024)
    p.add_argument("--test-lens", default="20,40,80,160,256,512",
                   type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--eval-batch", type=int, default=256)
    p.add_argument("--mult", action="store_true", help="arith_brackets: also use × (default: + and − only)")
    p.add_argument("--pack", default="auto", choices=("auto", "yes", "no"),
                   help="train on packed varlen batches without padding (auto: on CUDA only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, …")
    p.add_argument("--workers", type=int, default=None,
                   help="1: generate batches in a background process (default: 1 on CUDA, 0 on CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=None, help="output directory (default runs/TASK/MODEL_dD_lrLR_sSEED)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--stop-after", type=float, default=None,
                   help="seconds of training after which the run writes checkpoint_resume.pt and stops")
    p.add_argument("--resume", action="store_true", help="continue from --out's checkpoint_resume.pt if present")
    p.add_argument("--tag", default=None,
                   help="name of this run's configuration (set by `sweep --variant`): the summary has one row per "
                        "(task, model, tag)")


def train_args(task: str, argv: list[str]) -> argparse.Namespace:
    """The options ``python -m mamba3 train TASK ARGV…`` trains with (its defaults filled in)."""
    p = argparse.ArgumentParser(prog=f"python -m mamba3 train {task}",
                                description=f"Train one model on {task} (docs/state_tracking.md).")
    add_train_args(p)
    return _finish_train_args(p.parse_args(argv), task, argv)


def _finish_train_args(args, task: str, argv: list[str]):
    args.task = task
    if args.layers is None:
        args.layers = DEFAULT_LAYERS[task]
    if args.out is None:
        args.out = f"runs/{task}/{args.model}_d{args.d_model}_lr{args.lr:.2e}_s{args.seed}"
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workers is None:
        args.workers = 1 if resolve_device(args.device).type == "cuda" else 0
    args._argv = argv
    return args


# Demo: small enough for a few minutes on 2 CPU cores. Curriculum 8 → 64 (3 stages), model selection at length 64
# (the longest training length); the test columns include 256 (length extrapolation, which this short CPU budget
# does not reach: see docs/state_tracking.md). Δ is initialised in [0.5, 1] (Mamba3 dt_min/dt_max) instead of the
# default [0.001, 0.1]: parity needs rotations of π per token, i.e. Δ·tanh(·) ≈ 1, and starting there saves steps.
# One torch thread: the tensors are tiny, and on a shared 2-core machine two threads were several times slower.
DEMO_ARGS = ["--d-model", "32", "--layers", "1", "--batch", "32", "--steps", "900", "--lr", "5e-3",
             "--min-len", "3", "--max-len", "8:64", "--stages", "3", "--eval-len", "64", "--eval-every", "150",
             "--n-val", "256", "--n-test", "512", "--test-lens", "16,32,64,128,256", "--dt-min", "0.5",
             "--dt-max", "1.0", "--device", "cpu", "--threads", "1"]


def run_demo(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m mamba3 train demo",
                                description="CPU demo: Mamba-3 against its no-rotation ablation on parity.")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--models", default="mamba3,norope")
    p.add_argument("--quiet", action="store_true")
    a, extra = p.parse_known_args(argv)
    rows = []
    for m in a.models.split(","):
        run_argv = DEMO_ARGS + ["--model", m, "--out", str(Path(a.out) / m)] + (["--quiet"] if a.quiet else []) + extra
        args = train_args("parity", run_argv)
        print(f"== training {m} on parity ({' '.join(run_argv)})", flush=True)
        rows.append(train_run(args))
    print(format_table(rows, lengths=[r for r in rows[0]["test"]]))
    plot_runs(rows, Path(a.out) / "accuracy_vs_length.png", "parity (CPU demo): scaled accuracy vs length")
    (Path(a.out) / "demo.json").write_text(json.dumps(
        [{k: r[k] for k in ("model", "best_val_scaled", "test", "train_time_s", "wall_time_s")} for r in rows],
        indent=1))
    return 0


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def format_table(rows: list[dict], lengths=None) -> str:
    lengths = lengths or [str(rows[0]["eval_len"])]
    head = "| model | d_model | lr | best val scaled @%d | " % rows[0]["eval_len"] + " | ".join(
        f"test scaled @{L}" for L in lengths) + " | train time |"
    lines = [head, "|" + "---|" * (5 + len(lengths))]
    for r in rows:
        lines.append(f"| {r['model']} | {r['d_model']} | {r['lr']:.2e} | {_pct(r['best_val_scaled'])} | "
                     + " | ".join(f"{100 * r['test'][L]['scaled']:.2f}" if L in r["test"] else "–"
                                  for L in lengths) + f" | {r['train_time_s']:.0f} s |")
    return "\n".join(lines)


def lr_grid(spec: str) -> list[float]:
    """'8' → 8 values log-spaced in [1e-4, 1e-2]; 'LO:HI:N' → N log-spaced in [LO, HI]; '1e-3,3e-3' → a list."""
    if "," in spec or "e" in spec and ":" not in spec:
        return [float(x) for x in spec.split(",") if x]
    lo, hi, n = (1e-4, 1e-2, int(spec)) if ":" not in spec else (float(spec.split(":")[0]),
                                                                  float(spec.split(":")[1]),
                                                                  int(spec.split(":")[2]))
    if n == 1:
        return [lo]
    return [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (n - 1)) for i in range(n)]


def run_sweep(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mamba3 train sweep",
        description="The LR × d_model grid for one task and one or more model variants, as concurrent "
                    "subprocesses (many small runs share one GPU). Finished runs (results.json present) are "
                    "skipped and paused ones continue from their checkpoint_resume.pt, so an interrupted sweep "
                    "resumes. Extra options are passed to every run.")
    p.add_argument("task", choices=data.TASKS)
    p.add_argument("--models", default="mamba3")
    p.add_argument("--d-models", default="32,64")
    p.add_argument("--lrs", default="8", help="'8': 8 log-spaced in [1e-4, 1e-2]; 'LO:HI:N'; or a list")
    p.add_argument("--seeds", default="0")
    p.add_argument("--jobs", type=int, default=8, help="concurrent runs")
    p.add_argument("--gpus", default=None, help="comma-separated CUDA ids to spread runs over (default: all)")
    p.add_argument("--out", default="runs/sweep")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds after which no new run is started (running ones finish)")
    p.add_argument("--stop-after", type=float, default=None,
                   help="seconds after which running runs pause (checkpoint_resume.pt) and no new run starts: "
                        "the next sweep with the same command continues them")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                   help="repeatable: run the grid once per variant with ARGS added to its runs (e.g. "
                        "'nomlp=--mlp-ratio 0'), into OUT/TASK/MODEL/NAME/…; one summary row per variant")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    a, extra = p.parse_known_args(argv)
    variants = []  # (name or None, its extra arguments)
    for spec in a.variant:
        name, sep, args = spec.partition("=")
        if not sep or not name or "/" in name or name in {v for v, _ in variants}:
            p.error(f"--variant {spec!r}: expected a new NAME=ARGS, NAME without '/'")
        vargs = shlex.split(args)
        grid = {"--model", "--d-model", "--lr", "--seed", "--out", "--tag"} & {x.split("=")[0] for x in vargs}
        if grid:  # the run's directory is named after these
            p.error(f"--variant {spec!r}: {', '.join(sorted(grid))} belong to the grid (--models, --d-models, …)")
        variants.append((name, vargs))
    variants = variants or [(None, [])]
    gpus = a.gpus.split(",") if a.gpus else (
        [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [None])
    jobs = []
    for m in a.models.split(","):
        for name, vargs in variants:
            for d in [int(x) for x in a.d_models.split(",")]:
                for lr in lr_grid(a.lrs):
                    for s in [int(x) for x in a.seeds.split(",")]:
                        out = Path(a.out) / a.task / m / (name or "") / f"d{d}_lr{lr:.2e}_s{s}"
                        cmd = [sys.executable, "-m", "mamba3.tasks", "train", a.task, "--model", m, "--d-model",
                               str(d), "--lr", f"{lr:.6g}", "--seed", str(s), "--out", str(out), "--quiet",
                               "--resume"] + extra + vargs + (["--tag", name] if name else [])
                        jobs.append((out, cmd))
    todo = [(o, c) for o, c in jobs if not (o / "results.json").exists()]
    print(f"sweep {a.task}: {len(jobs)} runs, {len(jobs) - len(todo)} already done, {a.jobs} at a time "
          f"on {gpus}", flush=True)
    if a.dry_run:
        for _, c in todo:
            print(" ".join(c))
        return 0
    t0, running, k, failed, finished, paused = time.time(), [], 0, 0, 0, 0
    bar = Progress(len(todo), f"sweep {a.task}")

    def may_start():
        el = time.time() - t0
        return (a.time_budget is None or el < a.time_budget) and (a.stop_after is None or el < a.stop_after - 30)

    while todo or running:
        while todo and len(running) < a.jobs and may_start():
            out, cmd = todo.pop(0)
            if a.stop_after is not None:  # the run pauses itself at the sweep's deadline
                cmd = cmd + ["--stop-after", f"{a.stop_after - (time.time() - t0):.0f}"]
            out.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            if gpus[0] is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]
            log = open(out / "log.txt", "w")
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), out, log))
            k += 1
        if todo and not may_start():
            print(f"time budget reached: {len(todo)} runs not started (rerun the same command to resume)",
                  flush=True)
            todo = []
        time.sleep(1.0)
        for item in list(running):
            proc, out, log = item
            if proc.poll() is not None:
                log.close()
                running.remove(item)
                finished += 1
                if proc.returncode != 0:
                    failed += 1
                    print(f"FAILED ({proc.returncode}): {out} (see {out / 'log.txt'})", flush=True)
                elif not (out / "results.json").exists():
                    paused += 1
                bar.update(finished, f"{failed} failed, {paused} paused")
    if paused:
        print(f"{paused} runs paused (checkpoint_resume.pt): rerun the same command to continue them", flush=True)
    print(summarize(Path(a.out)))
    return 1 if failed else 0


def _origin(r: dict) -> str:
    """Where a run ran: 'GPU (or CPU) · torch … · triton … · git …' from its results.json."""
    parts = [r["machine"].get("gpu") or r["machine"].get("cpu")]
    parts += [f"{k} {r['versions'][k]}" for k in ("torch", "triton", "git") if k in r["versions"]]
    return " · ".join(str(p) for p in parts if p)


def _row_key(r: dict) -> tuple:
    """A summary row: (task, model, tag), tag = the sweep variant's name (None for runs without one), '+ema' added
    for the weight averages of :func:`_with_averages`."""
    tag = "+".join(x for x in (r.get("args", {}).get("tag"), r.get("weights")) if x)
    return r["task"], r["model"], tag or None


def _with_averages(runs: list[dict]) -> list[dict]:
    """The runs, and after each one trained with --ema its weight average as a run of its own (its selection and
    tests; tag '+ema'), so that a summary selects among averages by validation as it does among runs."""
    out = []
    for r in runs:
        out.append(r)
        if r.get("ema"):
            out.append(r | r["ema"] | {"weights": "ema"})
    return out


def _tag_label(r: dict) -> str:
    tag = _row_key(r)[2]
    return f" [{tag}]" if tag else ""


def summarize(root: Path) -> str:
    """Collect every results.json under root: per (task, model, variant) the run with the best validation accuracy
    (the paper's selection rule; the weight averages of runs trained with --ema as rows of their own) →
    summary.json / summary.md in root; returns the markdown."""
    runs = _with_averages([json.loads(p.read_text()) for p in sorted(Path(root).rglob("results.json"))])
    best: dict = {}
    for r in runs:
        key = _row_key(r)
        if key not in best or (r["best_val_acc"], -r["best_step"]) > (best[key]["best_val_acc"],
                                                                      -best[key]["best_step"]):
            best[key] = r
    lines = ["| task | model | runs | eval length | best val scaled | its test scaled | paper (Table 5b) | d_model | lr "
             "| layers | steps | its test pooled |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    rows = sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or ""))
    for (task, model, tag), r in rows:
        n = sum(1 for x in runs if _row_key(x) == (task, model, tag))
        paper = PAPER_TABLE_5B.get((task, model))
        lines.append(f"| {task} | {model}{_tag_label(r)} | {n} | {r['eval_len']} | {_pct(r['best_val_scaled'])} | "
                     f"{100 * r['test_scaled_at_eval_len']:.2f} | {'–' if paper is None else f'{paper:.2f}'} | "
                     f"{r['d_model']} | {r['lr']:.2e} | {r['layers']} | {r['steps']}"
                     + (f" (diverged at {r['diverged_at_step']})" if r.get("diverged_at_step") else "")
                     + f" | {_pooled_cell(r)} |")
        summary.append({k: r.get(k) for k in ("task", "model", "d_model", "lr", "layers", "seed", "steps",
                                              "diverged_at_step",
                                          "best_val_scaled", "test_scaled_at_eval_len", "best_step", "test",
                                          "test_pooled",
                                          "versions", "machine", "command")}
                       | {"tag": tag, "runs": n, "paper": paper})
    lines += ["", "Scaled accuracy = (accuracy − chance) / (1 − chance), %; each (task, model [variant]) row is "
              "its run with the best validation accuracy (test: fresh strings, same checkpoint; pooled: one accuracy "
              "over strings of lengths uniform in [first curriculum maximum, eval length], Grazzi et al.'s protocol)."]
    if any(r.get("weights") == "ema" for r in runs):
        lines += ["Rows tagged +ema: the runs' exponential moving averages of the weights (--ema), selected and "
                  "tested the same way."]
    lines += [f"Ran on: {o}" for o in sorted({_origin(r) for r in best.values()}) if o]
    md = "\n".join(lines)
    if runs:
        (Path(root) / "summary.json").write_text(json.dumps(summary, indent=1))
        (Path(root) / "summary.md").write_text(md + "\n")
        for task in sorted({r["task"] for r in runs}):
            plot_runs([r for (t, _, _), r in rows if t == task], Path(root) / f"{task}.png",
                      f"{task}: best run per model, scaled accuracy vs length")
    return md


def _pooled_cell(r: dict) -> str:
    p = r.get("test_pooled")  # absent from runs written before it existed
    return "–" if p is None else f"{100 * p['scaled']:.2f} ({p['lengths'][0]}-{p['lengths'][1]})"


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``[train] {parity, arith, arith_brackets, demo, sweep, summarize} ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        argv = argv[1:]
    commands = list(data.TASKS) + ["demo", "sweep", "summarize", "eval"]
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(__doc__.split("\n\n")[1] if argv and argv[0] in ("-h", "--help") else
              f"usage: python -m mamba3 train {{{', '.join(commands)}}} ... (--help after the command for options)",
              file=sys.stderr if not argv or argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        return run_demo(rest)
    if cmd == "sweep":
        return run_sweep(rest)
    if cmd == "eval":
        return run_eval(rest)
    if cmd == "summarize":
        if not rest:
            print("usage: python -m mamba3 train summarize DIR", file=sys.stderr)
            return 2
        print(summarize(Path(rest[0])))
        return 0
    args = train_args(cmd, rest)
    res = train_run(args)
    if res is None:  # paused by --stop-after
        return 0
    print(format_table([res], lengths=list(res["test"])))
    print(f"results: {Path(args.out) / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
