"""Per-head decay of a trained state-tracking checkpoint: how fast each Mamba-3 head forgets.

    python scripts/probe_decay.py CHECKPOINT [--length 512] [--n 64]

Runs the model (CPU, reference backend) on n strings of the run's task at one length and reports, per layer and
head, the mean log-decay per token (adt = A·Δ), the median of A, and the total log-decay over the string: the
factor e^{Σ adt} by which the first token's contribution to the state has shrunk at the answer. A head that must
carry information across the whole input (a running value) can do so at length L only if Σ adt stays moderate.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mamba3.tasks import data  # noqa: E402
from mamba3.tasks.train import load_checkpoint  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    ck = torch.load(a.checkpoint, map_location="cpu", weights_only=True)
    task = ck["task"]
    model = load_checkpoint(a.checkpoint).eval()
    seen = {}
    for i, block in enumerate(model.layers):
        layer = next(m for m in block.modules() if hasattr(m, "_project"))
        project = layer._project

        def record(u, project=project, i=i):
            out = project(u)
            seen[i] = (out[4].detach().double(), out[5].detach().double())    # ADT, DT: (B, T, H)
            return out
        layer._project = record
    batch = data.make_batch(task, [a.length] * a.n, torch.Generator().manual_seed(a.seed))
    T = int(batch.query.max()) + 1
    with torch.no_grad():
        model(batch.tokens[:, :T], batch.query)
    torch.set_printoptions(precision=3, linewidth=160, sci_mode=False)
    print(f"{task}, {a.n} strings of length {a.length} (the <bos> token excluded)")
    for i in sorted(seen):
        adt, dt = (x[:, 1:T] for x in seen[i])
        print(f"layer {i}: mean adt per token {adt.mean((0, 1))}")
        print(f"         median A            {(adt / dt).median(1).values.median(0).values}")
        print(f"         Σ adt (median row)  {adt.sum(1).median(0).values}")


if __name__ == "__main__":
    main()
