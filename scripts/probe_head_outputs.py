"""Per-head output size of a trained state-tracking checkpoint at the answer, across lengths: which heads leave the
range they had on the training lengths.

    python scripts/probe_head_outputs.py CHECKPOINT [--lengths 64,160,256,320] [--n 64] [--rescale-last-to 160]
                                         [--per-string]

Runs the model (CPU, reference backend) on n strings of the run's task per length and reports, per layer and head,
the root mean square at the answer position ("=") of that head's gated output, i.e. its columns of the layer's
out_proj input. A head whose output keeps growing with the length (a running count that does not decay) feeds
the layers above values they never saw in training; scripts/probe_decay.py says which heads do not decay.

With --rescale-last-to L it also tests whether that drift is what costs accuracy: the scaled test accuracy per
length (`train eval`'s test sets, 512 strings) as the model is and with the last layer's heads rescaled at the
answer, one factor per head and evaluation batch (256 strings of one length), to the size they have at length L.
A diagnostic, not a method: the factor uses the batch's statistics (no labels). With --per-string the factor is
per head and string instead (each head's output at one answer divided by its RMS over the head's channels, times
the head's RMS at length L): what a headwise norm before out_proj (`--outproj-norm`, trained in) could do at most
for that layer without seeing the rest of the batch.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mamba3.tasks.train import accuracy_at_lengths, load_checkpoint  # noqa: E402
from probe_decay import forward_on_strings  # noqa: E402


def head_output_rms(model, task: str, length: int, n: int, seed: int = 1) -> list[torch.Tensor]:
    """Per layer: the RMS over n strings of ``task`` at ``length`` (and over the head's channels) of each head's
    gated output at the answer position, (H,) float64."""
    mixers = [block.mixer for block in model.layers]
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


@contextlib.contextmanager
def last_layer_rescaled(model, target_rms: torch.Tensor, per_string: bool = False):
    """Within: every forward of ``model`` (padded batches, answer positions ``query``) scales each head of the last
    layer's gated output at the answer so that its RMS over the batch (``per_string``: over the head's channels at
    each string's answer) is ``target_rms`` (H,)."""
    last = model.layers[-1].mixer
    answer = {}

    def remember_query(mod, args):
        answer["query"] = args[1]

    def rescale(mod, args):
        y = args[0]
        rows = torch.arange(y.shape[0], device=y.device)
        at = y[rows, answer["query"]].reshape(y.shape[0], last.nheads, -1)
        rms = at.pow(2).mean(2, keepdim=True).sqrt() if per_string else at.pow(2).mean((0, 2))[:, None].sqrt()
        y = y.clone()
        y[rows, answer["query"]] = (at * (target_rms.to(y)[:, None] / rms)).reshape(y.shape[0], -1)
        return (y,)

    hooks = [model.register_forward_pre_hook(remember_query), last.out_proj.register_forward_pre_hook(rescale)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--lengths", default="64,160,256,320")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rescale-last-to", type=int, default=None, metavar="L")
    ap.add_argument("--per-string", action="store_true", help="rescale each string's answer, not the batch's RMS")
    a = ap.parse_args(argv)
    ck = torch.load(a.checkpoint, map_location="cpu", weights_only=True)
    task, mult = ck["task"], bool(ck["args"].get("mult", False))
    model = load_checkpoint(a.checkpoint)
    lengths = [int(s) for s in a.lengths.split(",")]
    per_length = [head_output_rms(model, task, L, a.n, a.seed) for L in lengths]
    print(f"{task}, {a.n} strings per length: RMS of each head's gated output at the answer")
    print("| layer | head | " + " | ".join(f"length {L}" for L in lengths) + " |")
    print("|---" * (2 + len(lengths)) + "|")
    for i, first in enumerate(per_length[0]):
        for h in range(first.numel()):
            print(f"| {i} | {h} | " + " | ".join(f"{rms[i][h]:.2f}" for rms in per_length) + " |")
    if a.rescale_last_to is not None:
        target = head_output_rms(model, task, a.rescale_last_to, a.n, a.seed)[-1]
        plain = accuracy_at_lengths(model, task, lengths, 512, mult, "cpu")
        with last_layer_rescaled(model, target, a.per_string):
            rescaled = accuracy_at_lengths(model, task, lengths, 512, mult, "cpu")
        print(f"\nScaled test accuracy (%), 512 strings per length; rescaled: the last layer's heads at the answer "
              f"scaled per {'string' if a.per_string else 'evaluation batch'} to their size at length "
              f"{a.rescale_last_to}")
        print("| | " + " | ".join(f"length {L}" for L in lengths) + " |")
        print("|---" * (1 + len(lengths)) + "|")
        for name, res in (("as trained", plain), ("rescaled", rescaled)):
            print(f"| {name} | " + " | ".join(f"{100 * res[str(L)]['scaled']:.2f}" for L in lengths) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
