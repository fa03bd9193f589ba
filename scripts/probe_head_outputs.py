"""Per-head output size of a trained state-tracking checkpoint at the answer, across lengths: which heads leave the
range they had on the training lengths.

    python scripts/probe_head_outputs.py CHECKPOINT [--lengths 64,160,256,320] [--n 64]

Runs the model (CPU, reference backend) on n strings of the run's task per length and reports, per layer and head,
the root mean square at the answer position ("=") of that head's gated output, i.e. its columns of the layer's
out_proj input. A head whose output keeps growing with the length (a running count that does not decay) feeds
the layers above values they never saw in training; scripts/probe_decay.py says which heads do not decay.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mamba3.tasks.train import load_checkpoint  # noqa: E402
from probe_decay import forward_on_strings  # noqa: E402


def head_output_rms(model, task: str, length: int, n: int, seed: int = 1) -> list[torch.Tensor]:
    """Per layer: the RMS over n strings of ``task`` at ``length`` (and over the head's channels) of each head's
    gated output at the answer position, (H,) float64."""
    mixers = [next(m for m in block.modules() if hasattr(m, "_project")) for block in model.layers]
    seen = {}
    hooks = [m.out_proj.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, args[0].detach()))
             for i, m in enumerate(mixers)]
    try:
        batch = forward_on_strings(model, task, length, n, seed)
    finally:
        for h in hooks:
            h.remove()
    rows = torch.arange(n)
    return [seen[i][rows, batch.query].double().reshape(n, m.nheads, -1).pow(2).mean((0, 2)).sqrt()
            for i, m in enumerate(mixers)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--lengths", default="64,160,256,320")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    task = torch.load(a.checkpoint, map_location="cpu", weights_only=True)["task"]
    model = load_checkpoint(a.checkpoint)
    lengths = [int(s) for s in a.lengths.split(",")]
    per_length = [head_output_rms(model, task, L, a.n, a.seed) for L in lengths]
    print(f"{task}, {a.n} strings per length: RMS of each head's gated output at the answer")
    print("| layer | head | " + " | ".join(f"length {L}" for L in lengths) + " |")
    print("|---" * (2 + len(lengths)) + "|")
    for i, first in enumerate(per_length[0]):
        for h in range(first.numel()):
            print(f"| {i} | {h} | " + " | ".join(f"{rms[i][h]:.2f}" for rms in per_length) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
