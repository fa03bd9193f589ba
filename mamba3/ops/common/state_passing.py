"""Chunk-state passing (shared by SISO and MIMO): the only sequential pass, and a light one.

Contract
--------
``state_passing(X, gsum, seq_table, max_chunks, init=None, final=None, reverse=False, out=None, kend=None)``, in
place on ``X`` (or into ``out``):

* ``X`` (nchunks, H, PN) fp32 contiguous (PN = P·N, any layout of the state as long as it is the same
  everywhere): on entry X[c] is chunk c's *local* contribution L[c]; on exit X[c] is the state carried *into*
  chunk c (forward) or the gradient arriving at the *end* of chunk c (reverse).
* ``gsum`` (nchunks, H) fp32: the chunk's total log-decay g[c] (state leaving = e^{g[c]}·state entering + L[c]).
* forward:  x = init[s] (zeros if None); for c in the sequence's chunks: X[c] ← x; x ← e^{g[c]}·x + L[c];
  final[s] ← x.  (Input states enter here, final states leave here.)
* reverse:  x = init[s] (the gradient of the final state, zeros if None); for c from the last chunk back:
  X[c] ← x; x ← e^{g[c]}·x + L[c]; final[s] ← x (the gradient of the sequence's input state).
  L[c] is then the chunk's local dS: Σ_i e^{cs_i}·dy_i q̃_iᵀ for SISO.
* ``init``/``final`` (NS, H, PN) fp32 or None.
* ``seq_table`` (NS, 2) int32 ``[first chunk, number of chunks]`` per sequence (``common.chunking``; MIMO's state
  chunks have their own), ``max_chunks`` the most chunks of any sequence (host int).
* ``out`` (nchunks, H, PN), any float dtype, or None (= ``X``): where the carried states go, rounded to its dtype.
  With another buffer ``X`` keeps the local terms, and the pass still runs in fp32: the 16-bit copy SISO's per-chunk
  kernels round to their dot dtype anyway costs half the bytes of an fp32 one, to write and to read.
* ``kend`` (reverse only): (S, S16, partials), S the (nchunks, H, PN) state entering every chunk (fp32, or a 16-bit
  copy kept from the forward), S16 a buffer of ``out``'s shape for S rounded to its dtype (or None: no copy),
  partials (``state_slabs``, nchunks, H) fp32: per slab of the state,
  e^{g[c]}·⟨the gradient ``out[c]`` receives (in fp32), S[c]⟩ (SISO's decay-gradient term, summed over slabs by
  its ``decay_grad_kernel``).

Grid (NS, H, cdiv(PN, BLOCK)): each program walks the chunks of one sequence for one slab of the state.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .launch import launch
from .tiles import fast_exp


@triton.jit(do_not_specialize=["max_chunks", "kend_stride"])
def state_passing_kernel(x_ptr, g_ptr, init_ptr, final_ptr, seq_table_ptr, out_ptr, fwd_ptr, fwd16_ptr, kend_ptr,
                         kend_stride, H, PN, max_chunks, BLOCK: tl.constexpr, HAS_INIT: tl.constexpr,
                         HAS_FINAL: tl.constexpr, REVERSE: tl.constexpr, KEND: tl.constexpr, COPY_S: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(2)
    first = tl.load(seq_table_ptr + s * 2).to(tl.int64)
    n = tl.load(seq_table_ptr + s * 2 + 1)
    o = blk * BLOCK + tl.arange(0, BLOCK)
    m = o < PN
    if HAS_INIT:
        x = tl.load(init_ptr + (s * H + h) * PN + o, mask=m, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BLOCK], dtype=tl.float32)
    # The trip count is a host int (the longest sequence's chunk count; shorter sequences idle through the
    # tail): a loop bound loaded from memory is fine compiled but not in the interpreter.
    # The next chunk's local state and decay are loaded one step ahead (before this step's store), so each step
    # waits on one DRAM round trip less; the loads never alias the store (different chunks).
    c0 = first + (n - 1) * REVERSE
    loc_next = tl.load(x_ptr + (c0 * H + h) * PN + o, mask=m & (n > 0), other=0.0)
    g_next = tl.load(g_ptr + c0 * H + h)
    for j in range(max_chunks):
        live = j < n
        if REVERSE:
            c = first + n - 1 - j
            cn = c - 1
        else:
            c = first + j
            cn = c + 1
        c = tl.where(live, c, first)
        has_next = j + 1 < n
        cn = tl.where(has_next, cn, first)
        loc = loc_next
        g = g_next
        loc_next = tl.load(x_ptr + (cn * H + h) * PN + o, mask=m & has_next, other=0.0)
        g_next = tl.load(g_ptr + cn * H + h)
        at = (c * H + h) * PN + o
        tl.store(out_ptr + at, x.to(out_ptr.dtype.element_ty), mask=m & live)
        if KEND:
            s_in = tl.load(fwd_ptr + at, mask=m & live, other=0.0).to(tl.float32)
            tl.store(kend_ptr + blk * kend_stride + c * H + h, fast_exp(g) * tl.sum(s_in * x, 0), mask=live)
            if COPY_S:
                tl.store(fwd16_ptr + at, s_in.to(fwd16_ptr.dtype.element_ty), mask=m & live)
        x = tl.where(live, fast_exp(g) * x + loc, x)
    if HAS_FINAL:
        tl.store(final_ptr + (s * H + h) * PN + o, x, mask=m)


def _block(pn: int, block: int) -> int:
    return min(block, triton.next_power_of_2(pn))


def state_slabs(pn: int, block: int) -> int:
    """How many slabs (programs per sequence and head, and ``kend`` partials per chunk) a state of pn elements is
    passed in at ``block``."""
    return triton.cdiv(pn, _block(pn, block))


def state_passing(X, gsum, seq_table, max_chunks: int, init=None, final=None, reverse=False, block=1024, out=None,
                  kend=None):
    H = X.shape[1]
    PN = X[0, 0].numel()
    out = X if out is None else out
    assert out.shape == X.shape and (kend is None or reverse), "out: X's shape; kend: the reverse pass only"
    fwd, fwd16, parts = kend if kend is not None else (X, X, X)
    launch(state_passing_kernel, (seq_table.shape[0], H, state_slabs(PN, block)),
        X, gsum, init if init is not None else X, final if final is not None else X, seq_table, out, fwd,
        fwd16 if fwd16 is not None else fwd, parts, parts.stride(0), H, PN, max_chunks, BLOCK=_block(PN, block),
        HAS_INIT=init is not None, HAS_FINAL=final is not None, REVERSE=reverse, KEND=kend is not None,
        COPY_S=fwd16 is not None, num_warps=4)
    return out
