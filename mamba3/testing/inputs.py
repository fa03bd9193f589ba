"""Random Mamba-3 operator inputs with realistic value ranges, for tests, checks and benchmarks.

Each maker returns a dict of keyword arguments for :func:`mamba3.mamba3_siso` / :func:`mamba3.mamba3_mimo`
(and the reference functions). ``input_states`` is included when ``states=True``.
"""
from __future__ import annotations

import math

import torch


def _decay_and_dt(bsz, nheads, seqlen, generator, device):
    """dt log-uniform in [1e-3, 1e-1] (as the layer initialises it), A in [−16, −1], adt = A·dt (fp32)."""
    log_dt = torch.empty(bsz, nheads, seqlen).uniform_(math.log(1e-3), math.log(1e-1), generator=generator)
    dt = torch.exp(log_dt)
    a = -torch.empty(bsz, nheads, seqlen).uniform_(1.0, 16.0, generator=generator)
    return (a * dt).to(device), dt.to(device)


def _rms_normed(shape, generator):
    x = torch.randn(shape, generator=generator)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)


def siso_inputs(bsz=2, seqlen=37, nheads=4, ngroups=2, dstate=16, headdim=8, nangles=4, *, dtype=torch.float32,
                device="cpu", with_D=True, with_z=True, states=False, shared_angles=False, cu_seqlens=None,
                seed=0):
    g = torch.Generator().manual_seed(seed)
    nseq = bsz if cu_seqlens is None else len(cu_seqlens) - 1
    adt, dt = _decay_and_dt(bsz, nheads, seqlen, g, device)
    angle_shape = (bsz, seqlen, nangles) if shared_angles else (bsz, seqlen, nheads, nangles)
    args = dict(
        q=_rms_normed((bsz, seqlen, ngroups, dstate), g), k=_rms_normed((bsz, seqlen, ngroups, dstate), g),
        v=torch.randn(bsz, seqlen, nheads, headdim, generator=g), adt=adt, dt=dt,
        trap=torch.randn(bsz, nheads, seqlen, generator=g),
        q_bias=1.0 + 0.1 * torch.randn(nheads, dstate, generator=g),
        k_bias=1.0 + 0.1 * torch.randn(nheads, dstate, generator=g),
        angles=torch.randn(angle_shape, generator=g),
        D=torch.randn(nheads, generator=g) if with_D else None,
        z=torch.randn(bsz, seqlen, nheads, headdim, generator=g) if with_z else None,
    )
    if states:
        args["input_states"] = (
            torch.rand(nseq, nheads, nangles, generator=g) * 2 * math.pi,
            0.1 * torch.randn(nseq, nheads, headdim, dstate, generator=g),
            torch.randn(nseq, nheads, dstate, generator=g),
            torch.randn(nseq, nheads, headdim, generator=g),
        )
    if cu_seqlens is not None:
        args["cu_seqlens"] = torch.as_tensor(cu_seqlens, dtype=torch.int32)
    return _place(args, dtype, device)


def mimo_inputs(bsz=2, seqlen=37, nheads=4, ngroups=2, dstate=16, headdim=8, rank=2, nangles=None, *,
                dtype=torch.float32, device="cpu", with_D=True, with_z=True, with_out=True, rms_norm=False,
                states=False, shared_angles=False, cu_seqlens=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    nangles = dstate // 4 if nangles is None else nangles
    nseq = bsz if cu_seqlens is None else len(cu_seqlens) - 1
    adt, dt = _decay_and_dt(bsz, nheads, seqlen, g, device)
    angle_shape = (bsz, seqlen, nangles) if shared_angles else (bsz, seqlen, nheads, nangles)
    args = dict(
        q=_rms_normed((bsz, seqlen, rank, ngroups, dstate), g),
        k=_rms_normed((bsz, seqlen, rank, ngroups, dstate), g),
        v=torch.randn(bsz, seqlen, nheads, headdim, generator=g), adt=adt, dt=dt,
        trap=torch.randn(bsz, nheads, seqlen, generator=g),
        q_bias=1.0 + 0.1 * torch.randn(nheads, rank, dstate, generator=g),
        k_bias=1.0 + 0.1 * torch.randn(nheads, rank, dstate, generator=g),
        mimo_v=(1.0 + 0.2 * torch.randn(nheads, rank, headdim, generator=g)) / rank,
        mimo_z=1.0 + 0.2 * torch.randn(nheads, rank, headdim, generator=g),
        mimo_out=(1.0 + 0.2 * torch.randn(nheads, rank, headdim, generator=g)) / rank if with_out else None,
        angles=torch.randn(angle_shape, generator=g),
        D=torch.randn(nheads, generator=g) if with_D else None,
        z=torch.randn(bsz, seqlen, nheads, headdim, generator=g) if with_z else None,
    )
    if rms_norm:
        args["rms_norm"] = True
        args["norm_weight"] = 1.0 + 0.1 * torch.randn(nheads, headdim, generator=g)
    if states:
        args["input_states"] = (
            torch.rand(nseq, nheads, nangles, generator=g) * 2 * math.pi,
            0.1 * torch.randn(nseq, nheads, headdim, dstate, generator=g),
            torch.randn(nseq, rank, nheads, dstate, generator=g),
            torch.randn(nseq, nheads, headdim, generator=g),
        )
    if cu_seqlens is not None:
        args["cu_seqlens"] = torch.as_tensor(cu_seqlens, dtype=torch.int32)
    return _place(args, dtype, device)


# adt, dt and the angle states stay fp32 (as the layer passes them) unless float64 is asked for.
_KEEP_FP32 = {"adt", "dt"}


def _place(args, dtype, device):
    def conv(name, x):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x.to(device) if isinstance(x, torch.Tensor) else x
        target = torch.float64 if dtype == torch.float64 else (torch.float32 if name in _KEEP_FP32 else dtype)
        return x.to(device=device, dtype=target)
    out = {}
    for name, x in args.items():
        if name == "input_states":
            out[name] = tuple(conv("state", s) for s in x)
        else:
            out[name] = conv(name, x)
    return out


def float64_copy(args):
    """The same inputs in float64 (for the exact reference), detached."""
    def conv(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.detach().to(torch.float64)
        return x
    return {k: (tuple(conv(s) for s in v) if isinstance(v, tuple) else conv(v)) for k, v in args.items()}


def tensor_leaves(args):
    """(name, tensor) of every floating input that takes a gradient, input states included."""
    leaves = []
    for name, x in args.items():
        if name == "input_states" and x is not None:
            leaves += [(f"input_states[{i}]", s) for i, s in enumerate(x)]
        elif isinstance(x, torch.Tensor) and x.is_floating_point():
            leaves.append((name, x))
    return leaves




def replace_leaves(args, named):
    """``args`` with the tensors named as in :func:`tensor_leaves` replaced by those in ``named``."""
    out = dict(args)
    for name, x in named.items():
        if name.startswith("input_states["):
            states = list(out["input_states"])
            states[int(name[len("input_states["):-1])] = x
            out["input_states"] = tuple(states)
        else:
            out[name] = x
    return out


__all__ = ["siso_inputs", "mimo_inputs", "float64_copy", "tensor_leaves", "replace_leaves"]
