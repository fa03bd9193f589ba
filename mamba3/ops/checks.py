"""Input validation and backend choice shared by the public SISO and MIMO functions.

Every check raises ``ValueError`` (or ``TypeError``) with the argument's name, the expected shape or dtype and
what was given, before anything is launched.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BACKENDS = ("auto", "reference", "triton")
PRECISIONS = ("ieee", "tf32")


def expect_shape(name, x, shape):
    """``shape`` entries may be None (any size)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    ok = x.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, x.shape))
    if not ok:
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor (fp16, bf16, fp32 or fp64), got {x.dtype}")


def check_common(q_shape_name, q, k, v, adt, dt, trap, angles, D, z, cu_seqlens, chunk_size, backend, precision,
                 dstate):
    """Checks shared by SISO and MIMO. Returns (B, T, H, P, A, number of sequences)."""
    expect_shape("v", v, (None, None, None, None))
    bsz, seqlen, nheads, headdim = v.shape
    if seqlen < 1:
        raise ValueError("the sequence length T must be at least 1")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape {q_shape_name}, got {tuple(q.shape)} and {tuple(k.shape)}")
    ngroups = q.shape[-2]
    if nheads % ngroups != 0:
        raise ValueError(f"the number of heads H={nheads} must be a multiple of the number of q/k groups G={ngroups}")
    if dstate % 2 != 0:
        raise ValueError(f"the state size N={dstate} must be even (rotations act on pairs)")
    for name, x in (("adt", adt), ("dt", dt), ("trap", trap)):
        expect_shape(name, x, (bsz, nheads, seqlen))
    if angles.dim() == 3:
        expect_shape("angles", angles, (bsz, seqlen, None))
    else:
        expect_shape("angles", angles, (bsz, seqlen, nheads, None))
    nangles = angles.shape[-1]
    if nangles > dstate // 2:
        raise ValueError(f"angles has A={nangles} angles per token; at most N/2 = {dstate // 2} pairs can rotate")
    if D is not None:
        expect_shape("D", D, (nheads,))
    if z is not None:
        expect_shape("z", z, (bsz, seqlen, nheads, headdim))
    nseq = bsz
    if cu_seqlens is not None:
        if bsz != 1:
            raise ValueError(f"cu_seqlens (varlen) needs batch size 1, got B={bsz}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
            raise ValueError("cu_seqlens must be a 1-D integer tensor of length (number of sequences + 1)")
        bounds = cu_seqlens.tolist()
        if bounds[0] != 0 or bounds[-1] != seqlen:
            raise ValueError(f"cu_seqlens must start at 0 and end at T={seqlen}, got {bounds[0]} … {bounds[-1]}")
        if any(e <= s for s, e in zip(bounds[:-1], bounds[1:])):
            raise ValueError("every sequence in cu_seqlens must have length ≥ 1 (cu_seqlens strictly increasing)")
        nseq = len(bounds) - 1
    if chunk_size is not None and (chunk_size < 1 or chunk_size & (chunk_size - 1)):
        raise ValueError(f"chunk_size must be a positive power of two, got {chunk_size}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    devices = {x.device for x in (q, k, v, adt, dt, trap, angles, D, z) if isinstance(x, torch.Tensor)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    return bsz, seqlen, nheads, headdim, nangles, nseq


def check_states(input_states, shapes):
    if input_states is None:
        return
    if not isinstance(input_states, (tuple, list)) or len(input_states) != 4:
        raise ValueError("input_states must be a tuple (angle, ssm, k, v) of 4 tensors")
    for name, x, shape in zip(("angle", "ssm", "k", "v"), input_states, shapes):
        expect_shape(f"input_states {name}", x, shape)


def choose_backend(op: str, backend: str, device: torch.device):
    """The Triton entry point of ``op`` ("siso" or "mimo"), or None for the PyTorch reference.

    auto: Triton for CUDA tensors, the reference otherwise. "triton" on CPU tensors runs the kernels under
    the Triton interpreter and needs TRITON_INTERPRET=1 set before mamba3 was imported.
    """
    if backend == "reference" or (backend == "auto" and device.type != "cuda"):
        return None
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter)")
    if importlib.util.find_spec(f"mamba3.ops.{op}.function") is None:
        if backend == "auto":              # this build ships no Triton kernels for the op: reference on CUDA
            return None
        raise ValueError(f"backend='triton' is not available for {op}: no Triton kernels in this build")
    module = importlib.import_module(f"mamba3.ops.{op}.function")
    return getattr(module, f"{op}_triton")
