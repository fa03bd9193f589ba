"""mamba3_siso / mamba3_mimo as torch custom ops (``mamba3::siso``, ``mamba3::mimo``) with fake-tensor
implementations and autograd, so ``torch.compile(model, fullgraph=True)`` traces through them.

The public functions are ``@torch.compiler.disable`` (a graph break, an error under fullgraph=True); the layer
calls :func:`siso` / :func:`mimo` below instead when it is being compiled. Forward runs the public function;
backward is a second custom op. On the Triton kernels SISO's calls their backward directly
(``siso.function.siso_triton_backward``, from the forward's inputs and final angle); otherwise (MIMO, whose
gradient runs through PyTorch preparation outside its kernels' Function, and the reference backend) it replays the
forward under autograd and differentiates it. In MIMO's replay the Triton op skips its kernels' forward work, which
its own backward recomputes anyway (:mod:`.common.replay`), so a compiled step runs the Triton forward once.
The decode step has its own op, ``mamba3::step`` (mamba3.ops.step.api).
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..reference.common import compute_dtype
from .checks import use_triton
from .common.replay import gradients_only
from .mimo.api import mamba3_mimo
from .siso.api import mamba3_siso

Tensor = torch.Tensor
SISO_TENSORS = ["q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "angles", "D", "z", "angle_in", "ssm_in",
                "k_in", "v_in"]
MIMO_TENSORS = ["q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "mimo_v", "mimo_z", "mimo_out", "angles",
                "D", "z", "angle_in", "ssm_in", "k_in", "v_in", "norm_weight"]


def _states(a, s, k, v):
    return None if a is None else (a, s, k, v)


def _siso_call(t, chunk_size, cu_seqlens, backend, precision):
    q, k, v, adt, dt, trap, qb, kb, ang, D, z, a_in, s_in, k_in, v_in = t
    out, st = mamba3_siso(q, k, v, adt, dt, trap, qb, kb, ang, D, z, _states(a_in, s_in, k_in, v_in),
                          chunk_size=chunk_size, cu_seqlens=cu_seqlens, return_final_states=True, backend=backend,
                          precision=precision)
    return [out, *st]


def _mimo_call(t, chunk_size, cu_seqlens, rms_norm, norm_eps, backend, precision):
    q, k, v, adt, dt, trap, qb, kb, mv, mz, mo, ang, D, z, a_in, s_in, k_in, v_in, nw = t
    out, st = mamba3_mimo(q, k, v, adt, dt, trap, qb, kb, mv, mz, mo, ang, D, z, _states(a_in, s_in, k_in, v_in),
                          chunk_size=chunk_size, cu_seqlens=cu_seqlens, rms_norm=rms_norm, norm_weight=nw,
                          norm_eps=norm_eps, return_final_states=True, backend=backend, precision=precision)
    return [out, *st]


def _fresh(outs):
    """Custom-op outputs may not alias inputs (the final v state is a view of v)."""
    return [o.clone() if o._base is not None or not o.is_contiguous() else o for o in outs]


def _final_state_fakes(v, nseq, nheads, headdim, dstate, nangles, kdims, cdtype):
    return [v.new_empty(nseq, nheads, nangles, dtype=cdtype), v.new_empty(nseq, nheads, headdim, dstate, dtype=cdtype),
            v.new_empty(*kdims, dtype=cdtype), v.new_empty(nseq, nheads, headdim)]


def _autograd_inside_custom_op():
    """A custom op's implementation runs with the Autograd dispatch keys excluded (it is "below autograd"), so
    a recompute inside it would record no graph. Re-admit them for the recompute (private API: torch 2.4–2.13)."""
    C = torch._C
    exclude = C._dispatch_tls_local_exclude_set()
    for name in ("AutogradOther", "AutogradFunctionality", "AutogradCPU", "AutogradCUDA"):
        key = getattr(C.DispatchKey, name, None)
        if key is not None:
            exclude = exclude.remove(key)
    return C._ForceDispatchKeyGuard(C._dispatch_tls_local_include_set(), exclude)


def _regrad(call, tensors, grads):
    """Gradients of call(tensors) w.r.t. every present tensor, for the output gradients ``grads``."""
    idx = [i for i, t in enumerate(tensors) if t is not None and t.is_floating_point()]
    with _autograd_inside_custom_op(), torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (tensors[i] for i in idx)]
        full = list(tensors)
        for i, leaf in zip(idx, leaves):
            full[i] = leaf
        with gradients_only():
            outs = call(full)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        got = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, got)]


# ----------------------------------------------------------------------------------------------------- SISO
@torch.library.custom_op("mamba3::siso", mutates_args=())
def siso_op(q: Tensor, k: Tensor, v: Tensor, adt: Tensor, dt: Tensor, trap: Tensor, q_bias: Tensor, k_bias: Tensor,
            angles: Tensor, D: Optional[Tensor], z: Optional[Tensor], angle_in: Optional[Tensor],
            ssm_in: Optional[Tensor], k_in: Optional[Tensor], v_in: Optional[Tensor], chunk_size: Optional[int],
            cu_seqlens: Optional[Tensor], backend: str, precision: str) -> List[Tensor]:
    t = [q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, angle_in, ssm_in, k_in, v_in]
    with torch.no_grad():
        return _fresh(_siso_call(t, chunk_size, cu_seqlens, backend, precision))


@siso_op.register_fake
def _(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, angle_in, ssm_in, k_in, v_in, chunk_size, cu_seqlens,
      backend, precision):
    bsz, _, nheads, headdim = v.shape
    nseq = bsz if cu_seqlens is None else cu_seqlens.shape[0] - 1
    cd = compute_dtype(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, ssm_in)
    dstate = q.shape[-1]
    return [torch.empty_like(v)] + _final_state_fakes(v, nseq, nheads, headdim, dstate, angles.shape[-1],
                                                      (nseq, nheads, dstate), cd)


@torch.library.custom_op("mamba3::siso_bwd", mutates_args=())
def siso_bwd_op(grads: List[Optional[Tensor]], final_angle: Tensor, q: Tensor, k: Tensor, v: Tensor, adt: Tensor,
                dt: Tensor, trap: Tensor, q_bias: Tensor, k_bias: Tensor, angles: Tensor, D: Optional[Tensor],
                z: Optional[Tensor], angle_in: Optional[Tensor], ssm_in: Optional[Tensor], k_in: Optional[Tensor],
                v_in: Optional[Tensor], chunk_size: Optional[int], cu_seqlens: Optional[Tensor], backend: str,
                precision: str) -> List[Tensor]:
    t = [q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, angle_in, ssm_in, k_in, v_in]
    if not use_triton(backend, t):
        return _regrad(lambda x: _siso_call(x, chunk_size, cu_seqlens, backend, precision), t, grads)
    # the Triton backward directly, from the forward's final angle: no replay of the forward under autograd (its
    # host time made a compiled SISO step host-bound: H200, B8 T4096, 9.4 ms of host time against 7.2 of GPU time)
    from .siso.function import siso_triton_backward

    got = siso_triton_backward(*t[:11], _states(*t[11:]), chunk_size, cu_seqlens, precision, final_angle, grads)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(t, got) if x is not None]


@siso_bwd_op.register_fake
def _(grads, final_angle, *args):
    return [torch.empty_like(t) for t in args[:15] if t is not None]


def _siso_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], *[t for t in inputs[:15] if t is not None],
                          *[t for t in inputs[16:17] if t is not None])
    ctx.present = [t is not None for t in inputs[:15]]
    ctx.has_cu = inputs[16] is not None
    ctx.chunk_size, ctx.backend, ctx.precision = inputs[15], inputs[17], inputs[18]


def _unpack(ctx, saved):
    tensors = [saved.pop(0) if p else None for p in ctx.present]
    cu = saved.pop(0) if ctx.has_cu else None
    return tensors, cu


def _siso_backward(ctx, grads):
    final_angle, *saved = ctx.saved_tensors
    tensors, cu = _unpack(ctx, saved)
    got = iter(siso_bwd_op(list(grads), final_angle, *tensors, ctx.chunk_size, cu, ctx.backend, ctx.precision))
    return (*[next(got) if t is not None else None for t in tensors], None, None, None, None)


siso_op.register_autograd(_siso_backward, setup_context=_siso_setup)


# ----------------------------------------------------------------------------------------------------- MIMO
@torch.library.custom_op("mamba3::mimo", mutates_args=())
def mimo_op(q: Tensor, k: Tensor, v: Tensor, adt: Tensor, dt: Tensor, trap: Tensor, q_bias: Tensor, k_bias: Tensor,
            mimo_v: Tensor, mimo_z: Tensor, mimo_out: Optional[Tensor], angles: Tensor, D: Optional[Tensor],
            z: Optional[Tensor], angle_in: Optional[Tensor], ssm_in: Optional[Tensor], k_in: Optional[Tensor],
            v_in: Optional[Tensor], norm_weight: Optional[Tensor], chunk_size: Optional[int],
            cu_seqlens: Optional[Tensor], rms_norm: bool, norm_eps: float, backend: str,
            precision: str) -> List[Tensor]:
    t = [q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, angle_in, ssm_in, k_in,
         v_in, norm_weight]
    with torch.no_grad():
        return _fresh(_mimo_call(t, chunk_size, cu_seqlens, rms_norm, norm_eps, backend, precision))


@mimo_op.register_fake
def _(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, angle_in, ssm_in, k_in, v_in,
      norm_weight, chunk_size, cu_seqlens, rms_norm, norm_eps, backend, precision):
    bsz, seqlen, nheads, headdim = v.shape
    rank, dstate = q.shape[2], q.shape[-1]
    nseq = bsz if cu_seqlens is None else cu_seqlens.shape[0] - 1
    cd = compute_dtype(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, angles, D, z, ssm_in)
    out = v.new_empty(bsz, seqlen, rank, nheads, headdim) if mimo_out is None else torch.empty_like(v)
    return [out] + _final_state_fakes(v, nseq, nheads, headdim, dstate, angles.shape[-1],
                                      (nseq, rank, nheads, dstate), cd)


@torch.library.custom_op("mamba3::mimo_bwd", mutates_args=())
def mimo_bwd_op(grads: List[Optional[Tensor]], q: Tensor, k: Tensor, v: Tensor, adt: Tensor, dt: Tensor,
                trap: Tensor, q_bias: Tensor, k_bias: Tensor, mimo_v: Tensor, mimo_z: Tensor,
                mimo_out: Optional[Tensor], angles: Tensor, D: Optional[Tensor], z: Optional[Tensor],
                angle_in: Optional[Tensor], ssm_in: Optional[Tensor], k_in: Optional[Tensor],
                v_in: Optional[Tensor], norm_weight: Optional[Tensor], chunk_size: Optional[int],
                cu_seqlens: Optional[Tensor], rms_norm: bool, norm_eps: float, backend: str,
                precision: str) -> List[Tensor]:
    t = [q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, angle_in, ssm_in, k_in,
         v_in, norm_weight]
    return _regrad(lambda x: _mimo_call(x, chunk_size, cu_seqlens, rms_norm, norm_eps, backend, precision), t, grads)


@mimo_bwd_op.register_fake
def _(grads, *args):
    return [torch.empty_like(t) for t in args[:19] if t is not None]


def _mimo_setup(ctx, inputs, output):
    ctx.save_for_backward(*[t for t in inputs[:19] if t is not None], *[t for t in inputs[20:21] if t is not None])
    ctx.present = [t is not None for t in inputs[:19]]
    ctx.has_cu = inputs[20] is not None
    ctx.chunk_size, ctx.rms_norm, ctx.norm_eps = inputs[19], inputs[21], inputs[22]
    ctx.backend, ctx.precision = inputs[23], inputs[24]


def _mimo_backward(ctx, grads):
    tensors, cu = _unpack(ctx, list(ctx.saved_tensors))
    got = iter(mimo_bwd_op(list(grads), *tensors, ctx.chunk_size, cu, ctx.rms_norm, ctx.norm_eps, ctx.backend,
                           ctx.precision))
    return (*[next(got) if t is not None else None for t in tensors], None, None, None, None, None, None)


mimo_op.register_autograd(_mimo_backward, setup_context=_mimo_setup)


# ------------------------------------------------------------------------------------ public-style wrappers
def siso(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D=None, z=None, input_states=None, *, chunk_size=None,
         cu_seqlens=None, return_final_states=False, backend="auto", precision="ieee"):
    """:func:`mamba3.mamba3_siso` through the ``mamba3::siso`` custom op (same arguments and returns)."""
    st = input_states if input_states is not None else (None,) * 4
    out, *final = siso_op(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, *st, chunk_size, cu_seqlens,
                          backend, precision)
    return (out, tuple(final)) if return_final_states else out


def mimo(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D=None, z=None,
         input_states=None, *, chunk_size=None, cu_seqlens=None, rms_norm=False, norm_weight=None, norm_eps=1e-5,
         return_final_states=False, backend="auto", precision="ieee"):
    """:func:`mamba3.mamba3_mimo` through the ``mamba3::mimo`` custom op (same arguments and returns)."""
    st = input_states if input_states is not None else (None,) * 4
    out, *final = mimo_op(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, *st,
                          norm_weight, chunk_size, cu_seqlens, bool(rms_norm), float(norm_eps), backend, precision)
    return (out, tuple(final)) if return_final_states else out
