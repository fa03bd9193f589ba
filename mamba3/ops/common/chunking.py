"""Chunk tables: how the token axis is cut into chunks, for dense batches and for varlen (``cu_seqlens``).

Contract (used by SISO and MIMO kernels alike):

* A *chunk* is at most ``C`` consecutive tokens of one sequence; chunks never straddle sequences. Chunks are
  numbered globally ``c = 0 .. nchunks-1``, sequence by sequence, in time order.
* ``chunk_table`` (nchunks, 5) int32 on the device, one row per chunk:
  ``[bidx, t0, L, seq, t_end]``: the batch row ``bidx`` (0 for varlen), the first token's time index ``t0``
  inside that batch row, the chunk length ``L`` (1..C), the sequence index ``seq`` (0..NS-1: indexes the states),
  and ``t_end`` = one past the sequence's last token in the batch row (so token t has a successor in its own
  sequence iff ``t + 1 < t_end``).
* ``seq_table`` (NS, 2) int32: ``[first chunk, number of chunks]`` of every sequence.
* ``chunk_seq`` (nchunks,) int64, ``seq_first`` (NS,) int64, ``seq_last`` (NS,) int64 are torch index helpers for
  host-side prefix sums over chunks.

A dense batch (B, T) is NS = B sequences of length T and needs no host synchronisation; varlen reads
``cu_seqlens`` on the host once (no synchronisation either when ``cu_seqlens`` is a CPU tensor).

The tables are read-only, so :func:`make_chunks` keeps the last ``_CACHE_SIZE`` of them (per shape or
``cu_seqlens`` values, chunk size, device and stream): every layer of a model, and a backward after its forward,
reuses them instead of rebuilding them with ≈ 15 small launches (dense) or a Python loop and three copies
(varlen). Not while a CUDA graph is being captured: tensors made then hold their values only in the graph's replays,
and a cached table the graph read could be freed by the cache while the graph lives. Tables are built outside
inference mode, so that a table first made under ``torch.inference_mode()`` can index autograd-recorded ops later
(an inference tensor cannot be saved for backward).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

_CACHE_SIZE = 32
_CACHE: OrderedDict = OrderedDict()
_CACHE_LOCK = threading.Lock()


@dataclass
class Chunks:
    chunk_size: int
    nchunks: int
    nseq: int
    chunk_table: torch.Tensor  # (nchunks, 5) int32
    seq_table: torch.Tensor  # (NS, 2) int32
    chunk_seq: torch.Tensor  # (nchunks,) int64
    seq_first: torch.Tensor  # (NS,) int64
    seq_last: torch.Tensor  # (NS,) int64
    seq_start_tok: torch.Tensor  # (NS,) int64: time index of each sequence's first token in its batch row
    seq_last_tok: torch.Tensor  # (NS,) int64: time index of each sequence's last token in its batch row
    seq_bidx: torch.Tensor  # (NS,) int64: batch row of each sequence
    max_chunks: int = 0  # most chunks of any one sequence (host int: bound of the state-passing loop)

    @property
    def equal_chunks(self) -> bool:
        """Every sequence has ``max_chunks`` chunks (always for dense batches; varlen when the lengths allow)."""
        return self.nchunks == self.nseq * self.max_chunks


def make_chunks(bsz: int, seqlen: int, chunk_size: int, cu_seqlens: torch.Tensor | None, device) -> Chunks:
    """The chunk tables of a dense (B, T) batch or of packed sequences (``cu_seqlens``), cached (module docstring)."""
    device = torch.device(device)
    cu = None if cu_seqlens is None else tuple(int(x) for x in cu_seqlens.tolist())
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_current_stream_capturing():
            return _build(bsz, seqlen, int(chunk_size), cu, device)
        stream = torch.cuda.current_stream(device).cuda_stream
    else:
        stream = 0
    key = (bsz, seqlen, cu, int(chunk_size), device, stream)
    with _CACHE_LOCK:
        chunks = _CACHE.get(key)
        if chunks is not None:
            _CACHE.move_to_end(key)
            return chunks
    chunks = _build(bsz, seqlen, int(chunk_size), cu, device)
    with _CACHE_LOCK:
        _CACHE[key] = chunks
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return chunks


def _build(bsz: int, seqlen: int, C: int, cu: tuple | None, device) -> Chunks:
    with torch.inference_mode(False):
        return _tables(bsz, seqlen, C, cu, device)


def _tables(bsz: int, seqlen: int, C: int, cu: tuple | None, device) -> Chunks:
    if cu is None:
        ncs = (seqlen + C - 1) // C
        NS = bsz
        nchunks = NS * ncs
        c = torch.arange(nchunks, device=device, dtype=torch.int64)
        b = c // ncs
        j = c % ncs
        t0 = j * C
        L = torch.clamp(seqlen - t0, max=C)
        tend = torch.full_like(c, seqlen)
        table = torch.stack([b, t0, L, b, tend], 1).to(torch.int32).contiguous()
        s = torch.arange(NS, device=device, dtype=torch.int64)
        seq_first = s * ncs
        seq_table = torch.stack([seq_first, torch.full_like(s, ncs)], 1).to(torch.int32).contiguous()
        return Chunks(C, nchunks, NS, table, seq_table, b, seq_first, seq_first + ncs - 1,
                      torch.zeros_like(s), torch.full_like(s, seqlen - 1), s, ncs)
    rows, seqs = [], []
    for s in range(len(cu) - 1):
        start, end = cu[s], cu[s + 1]
        first = len(rows)
        for t0 in range(start, end, C):
            rows.append((0, t0, min(C, end - t0), s, end))
        seqs.append((first, len(rows) - first))
    # host tensors copied without blocking (a blocking copy would wait for the device's queue to drain)
    table = torch.tensor(rows, dtype=torch.int32).to(device, non_blocking=True)
    seq_table = torch.tensor(seqs, dtype=torch.int32).to(device, non_blocking=True)
    chunk_seq = table[:, 3].to(torch.int64)
    seq_first = seq_table[:, 0].to(torch.int64)
    cu_t = torch.tensor(cu, dtype=torch.int64).to(device, non_blocking=True)
    return Chunks(C, len(rows), len(seqs), table, seq_table, chunk_seq, seq_first,
                  seq_first + seq_table[:, 1].to(torch.int64) - 1, cu_t[:-1], cu_t[1:] - 1,
                  torch.zeros(len(seqs), dtype=torch.int64, device=device), max(n for _, n in seqs))
