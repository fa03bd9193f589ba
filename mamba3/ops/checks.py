"""Input validation and backend choice shared by the public SISO and MIMO functions.

Every check raises ``ValueError`` (or ``TypeError``) with the argument's name, the expected shape or dtype and
what was given, before anything is launched.
"""
from __future__ import annotations

import functools
import importlib
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


def check_heads(q, nheads):
    """GQA and rotation constraints on q (…, G, N). Returns (G, N)."""
    ngroups, dstate = q.shape[-2], q.shape[-1]
    if nheads % ngroups != 0:
        raise ValueError(f"the number of heads H={nheads} must be a multiple of the number of q/k groups G={ngroups}")
    if dstate % 2 != 0:
        raise ValueError(f"the state size N={dstate} must be even (rotations act on pairs)")
    return ngroups, dstate


def check_token_inputs(adt, dt, trap, angles, D, z, lead, nheads, headdim, dstate):
    """Per-token inputs of a sequence (lead = (B, T)) or of one decode step (lead = (B,)): adt, dt, trap
    (B, H[, T]); angles (B[, T], H, A) or shared across heads (B[, T], A); D (H,); z (B[, T], H, P).
    Returns the number of angles A."""
    bsz, steps = lead[0], tuple(lead[1:])
    for name, x in (("adt", adt), ("dt", dt), ("trap", trap)):
        expect_shape(name, x, (bsz, nheads, *steps))
    if angles.dim() == 2 + len(steps):
        expect_shape("angles", angles, (bsz, *steps, None))
    else:
        expect_shape("angles", angles, (bsz, *steps, nheads, None))
    nangles = angles.shape[-1]
    if nangles > dstate // 2:
        raise ValueError(f"angles has A={nangles} angles per token; at most N/2 = {dstate // 2} pairs can rotate")
    if D is not None:
        expect_shape("D", D, (nheads,))
    if z is not None:
        expect_shape("z", z, (bsz, *steps, nheads, headdim))
    return nangles


def check_mimo_params(q_bias, k_bias, mimo_v, mimo_z, mimo_out, rms_norm, norm_weight, nheads, rank, dstate,
                      headdim):
    """The per-head MIMO parameters. Returns norm_weight as (H, P) (or None)."""
    for name, x, last in (("q_bias", q_bias, dstate), ("k_bias", k_bias, dstate), ("mimo_v", mimo_v, headdim),
                          ("mimo_z", mimo_z, headdim), ("mimo_out", mimo_out, headdim)):
        if x is not None or name != "mimo_out":
            expect_shape(name, x, (nheads, rank, last))
    if norm_weight is None:
        return None
    if not rms_norm:
        raise ValueError("norm_weight is given but rms_norm=False")
    if norm_weight.numel() == nheads * headdim:
        norm_weight = norm_weight.reshape(nheads, headdim)
    expect_shape("norm_weight", norm_weight, (nheads, headdim))
    return norm_weight


def check_common(q_shape_name, q, k, v, adt, dt, trap, angles, D, z, cu_seqlens, chunk_size, precision):
    """Checks shared by SISO and MIMO sequences. Returns (B, T, H, P, N, A, number of sequences)."""
    expect_shape("v", v, (None, None, None, None))
    bsz, seqlen, nheads, headdim = v.shape
    if seqlen < 1:
        raise ValueError("the sequence length T must be at least 1")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape {q_shape_name}, got {tuple(q.shape)} and {tuple(k.shape)}")
    _, dstate = check_heads(q, nheads)
    nangles = check_token_inputs(adt, dt, trap, angles, D, z, (bsz, seqlen), nheads, headdim, dstate)
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
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return bsz, seqlen, nheads, headdim, dstate, nangles, nseq


def check_states(input_states, shapes):
    if input_states is None:
        return
    if not isinstance(input_states, (tuple, list)) or len(input_states) != 4:
        raise ValueError("input_states must be a tuple (angle, ssm, k, v) of 4 tensors")
    for name, x, shape in zip(("angle", "ssm", "k", "v"), input_states, shapes):
        expect_shape(f"input_states {name}", x, shape)


def use_triton(backend: str, tensors) -> bool:
    """Whether the Triton kernels run: auto = for CUDA tensors unless an input is float64 (the kernels compute
    in fp32; float64 is the reference's exact mode); "triton" on CPU tensors runs the kernels under the Triton
    interpreter and needs TRITON_INTERPRET=1 set before mamba3 was imported."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    flat = [t for x in tensors for t in (x if isinstance(x, (tuple, list)) else (x,)) if isinstance(t, torch.Tensor)]
    devices = {t.device for t in flat}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    fp64 = any(t.dtype == torch.float64 for t in flat)
    if backend == "reference" or (backend == "auto" and (device.type != "cuda" or fp64)):
        return False
    if fp64:
        raise ValueError("backend='triton' computes in fp32; float64 inputs need backend='reference' (or auto)")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter)")
    return True


def choose_backend(op: str, backend: str, tensors):
    """The Triton entry point of ``op`` ("siso" or "mimo") when :func:`use_triton` says so, else None (the
    PyTorch reference). The entry points run with the tensors' device current (:func:`on_device_of`)."""
    if not use_triton(backend, tensors):
        return None
    module = importlib.import_module(f"mamba3.ops.{op}.function")
    return getattr(module, f"{op}_triton")


def on_device_of(fn):
    """Decorator for the Triton entry points: ``fn`` run with its first argument's CUDA device current. Triton
    launches on the current device and its current stream, so tensors on cuda:1 while cuda:0 is current would
    otherwise be handed to a kernel on cuda:0. (Backward passes run on the autograd engine's thread for the
    tensors' device, which sets that device.)"""
    @functools.wraps(fn)
    def run(first, *args, **kwargs):
        if not first.is_cuda:
            return fn(first, *args, **kwargs)
        with torch.cuda.device(first.device):
            return fn(first, *args, **kwargs)
    return run
