"""Per-head decay of a trained state-tracking checkpoint: how fast each Mamba-3 head forgets.

    python scripts/probe_decay.py CHECKPOINT [--length 512] [--n 64]

Runs the model (CPU, reference backend) on n strings of the run's task at one length and reports, per layer and
head, the mean log-decay per token (adt = A·Δ), the median of A, and the total log-decay over the string: the
factor e^{Σ adt} by which the first token's contribution to the state has shrunk at the answer. A head that must
carry information across the whole input (a running value) can do so at length L only if Σ adt stays moderate.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mamba3.tasks import data  # noqa: E402
from mamba3.tasks.train import load_checkpoint  # noqa: E402


def forward_on_strings(model, task: str, length: int, n: int, seed: int = 1) -> data.Batch:
    """Run ``model`` (in eval mode, without gradients) on n strings of ``task`` at ``length``; the batch it read,
    its tokens cut after the last answer position."""
    batch = data.make_batch(task, [length] * n, torch.Generator().manual_seed(seed))
    T = int(batch.query.max()) + 1
    batch = dataclasses.replace(batch, tokens=batch.tokens[:, :T])
    was = model.training
    model.eval()
    with torch.no_grad():
        model(batch.tokens, batch.query)
    model.train(was)
    return batch


def decay_stats(model, task: str, length: int, n: int, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Per layer: mean adt per token, median A and the median over strings of Σ adt, each per head (float64),
    over n strings of ``task`` at ``length`` (the <bos> token excluded)."""
    seen = {}
    saved = []
    for i, block in enumerate(model.layers):
        layer = block.mixer
        project = layer._project

        def record(u, project=project, i=i):
            out = project(u)
            seen[i] = (out[4].detach().double(), out[5].detach().double())    # ADT, DT: (B, T, H)
            return out
        layer._project = record
        saved.append((layer, project))
    try:
        T = forward_on_strings(model, task, length, n, seed).tokens.shape[1]
    finally:
        for layer, project in saved:
            layer._project = project
    out = []
    for i in sorted(seen):
        adt, dt = (x[:, 1:T] for x in seen[i])
        out.append(dict(mean_adt=adt.mean((0, 1)), median_A=(adt / dt).median(1).values.median(0).values,
                        total=adt.sum(1).median(0).values))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    task = torch.load(a.checkpoint, map_location="cpu", weights_only=True)["task"]
    stats = decay_stats(load_checkpoint(a.checkpoint), task, a.length, a.n, a.seed)
    torch.set_printoptions(precision=3, linewidth=160, sci_mode=False)
    print(f"{task}, {a.n} strings of length {a.length} (the <bos> token excluded)")
    for i, s in enumerate(stats):
        print(f"layer {i}: mean adt per token {s['mean_adt']}")
        print(f"         median A            {s['median_A']}")
        print(f"         Σ adt (median row)  {s['total']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
