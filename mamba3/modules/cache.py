"""Inference cache of the Mamba-3 layer and the generation bookkeeping object.

Per layer, the official layout: angle (B, H, A) fp32, ssm (B, H, P, N) fp32, k (B, R, H, N) (R = 1 for SISO),
v (B, H, P). We keep k in fp32 (it is the rotated, biased k̃ of the last token, a computed quantity: fp32
keeps decoding equal to the chunked forward) and v in the model dtype (it is a raw input).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch


class Mamba3State(NamedTuple):
    """The recurrent state of one Mamba-3 layer after a token (unpacks like the official 4-tuple)."""

    angle: torch.Tensor   # (B, H, A) fp32, in [0, 2π)
    ssm: torch.Tensor     # (B, H, P, N) fp32
    k: torch.Tensor       # (B, R, H, N)
    v: torch.Tensor       # (B, H, P)

    def rows(self, n: int) -> "Mamba3State":
        """The first n rows (views: writes go to the cache)."""
        return Mamba3State(*(s[:n] for s in self))

    def zero_(self) -> "Mamba3State":
        for s in self:
            s.zero_()
        return self


def allocate_state(batch_size, nheads, headdim, dstate, nangles, rank, device, dtype, state_dtype=torch.float32):
    f = dict(device=device, dtype=state_dtype)
    return Mamba3State(angle=torch.zeros(batch_size, nheads, nangles, **f),
                       ssm=torch.zeros(batch_size, nheads, headdim, dstate, **f),
                       k=torch.zeros(batch_size, rank, nheads, dstate, **f),
                       v=torch.zeros(batch_size, nheads, headdim, device=device, dtype=dtype))


@dataclass
class InferenceParams:
    """Generation bookkeeping, field-compatible with ``mamba_ssm.utils.generation.InferenceParams``.

    ``key_value_memory_dict[layer_idx]`` holds each layer's :class:`Mamba3State`; ``seqlen_offset`` is the number
    of tokens already consumed (0 = the next forward is a prefill).
    """

    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    batch_size_offset: int = 0
    key_value_memory_dict: dict = field(default_factory=dict)
    lengths_per_sample: torch.Tensor | None = None

    def reset(self, max_seqlen, max_batch_size):
        self.max_seqlen = max_seqlen
        self.max_batch_size = max_batch_size
        self.seqlen_offset = 0
        for state in self.key_value_memory_dict.values():
            for s in state:
                s.zero_()
