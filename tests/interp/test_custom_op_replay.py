"""The torch custom ops' backward (``mamba3::siso_bwd`` / ``mamba3::mimo_bwd``, what a compiled model runs) on the
Triton kernels under the interpreter: SISO's calls the Triton backward directly, MIMO's forward replay skips the
kernels' forward work (``common.replay``); both give the gradients that autograd through the public function
gives, final states included."""
import pytest
import torch

import mamba3
from mamba3.ops import custom_ops
from mamba3.testing.errors import assert_rel_close
from mamba3.testing.inputs import mimo_inputs, siso_inputs

SISO_NAMES = ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "angles", "D", "z")
MIMO_NAMES = ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "mimo_v", "mimo_z", "mimo_out", "angles", "D",
              "z")


def _output_grads(outs, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]


def _eager_grads(fn, args, names, grads):
    """Gradients of fn(**args) (out and the four final states) w.r.t. the present tensors ``names`` and the input
    states."""
    leaves = {n: args[n].detach().requires_grad_(True) for n in names if args.get(n) is not None}
    states = tuple(s.detach().requires_grad_(True) for s in args["input_states"])
    out, fin = fn(**dict(args, **leaves, input_states=states), return_final_states=True, backend="triton")
    outs = [out, *fin]
    got = torch.autograd.grad(outs, [*leaves.values(), *states], grads, allow_unused=True)
    return outs, [torch.zeros_like(x) if g is None else g for x, g in zip([*leaves.values(), *states], got)]


@pytest.mark.parametrize("case", ["dense-states", "varlen-gqa", "dense-out-grad-only"])
def test_siso_backward_op_calls_the_triton_backward_directly(monkeypatch, case):
    """mamba3::siso_bwd on the Triton kernels runs no forward (no output kernel, the chunk states only as the
    backward's recompute and dS pass) and gives autograd's gradients through the public function, the final k̃ and
    v states' share (differentiated outside the Function) included; an output without a gradient (None) counts
    as zeros."""
    from mamba3.ops.siso.check import launched_kernels

    kw = dict(bsz=2, seqlen=21, nheads=2, ngroups=1, dstate=16, headdim=16, nangles=4, states=True, seed=5)
    if case == "varlen-gqa":
        kw.update(bsz=1, seqlen=30, nheads=4, ngroups=2, cu_seqlens=[0, 7, 19, 30])
    a = siso_inputs(**kw)
    cu = a.pop("cu_seqlens", None)
    out, fin = mamba3.mamba3_siso(**a, cu_seqlens=cu, return_final_states=True, backend="triton")
    grads = _output_grads([out, *fin], seed=6)
    if case == "dense-out-grad-only":
        grads = [grads[0], None, None, None, None]
    _, want = _eager_grads(lambda **x: mamba3.mamba3_siso(**x, cu_seqlens=cu), a, SISO_NAMES,
                           [torch.zeros_like(o) if g is None else g for o, g in zip([out, *fin], grads)])
    launched = launched_kernels(monkeypatch)
    tensors = [a[n] for n in SISO_NAMES] + list(a["input_states"])
    got = custom_ops.siso_bwd_op(grads, fin[0], *tensors, None, cu, "triton", "ieee")
    assert "output_kernel" not in launched, launched
    assert launched.count("chunk_state_kernel") == 2, launched  # MODE 0 recompute + MODE 1 (dS)
    names = [n for n, t in zip([*SISO_NAMES, "angle_in", "ssm_in", "k_in", "v_in"], tensors) if t is not None]
    assert len(got) == len(want) == len(names)
    for n, x, y in zip(names, got, want):
        assert x.dtype == y.dtype, (n, x.dtype, y.dtype)
        assert_rel_close(f"d{n}", x, y, 1e-6)


def test_mimo_backward_op_skips_the_forward_kernels(monkeypatch):
    from mamba3.ops.mimo import launch as L

    a = mimo_inputs(bsz=1, seqlen=19, nheads=2, ngroups=1, dstate=16, headdim=16, rank=2, nangles=4, states=True,
                    seed=7)
    out, fin = mamba3.mamba3_mimo(**a, return_final_states=True, backend="triton")
    grads = _output_grads([out, *fin], seed=8)
    _, want = _eager_grads(mamba3.mamba3_mimo, a, MIMO_NAMES, grads)
    calls = []
    for name in ("forward", "out_pass"):
        real = getattr(L, name)
        monkeypatch.setattr(L, name, lambda *args, _real=real, _name=name, **kw: (
            calls.append((_name, kw.get("bwd", False))), _real(*args, **kw))[1])
    tensors = [a[n] for n in MIMO_NAMES] + list(a["input_states"]) + [None]
    got = custom_ops.mimo_bwd_op(grads, *tensors, None, None, False, 1e-5, "triton", "ieee")
    # the states once (the backward's recompute) and the output kernel only as the epilogue backward
    assert calls == [("forward", False), ("out_pass", True)], calls
    names = [n for n, t in zip([*MIMO_NAMES, "angle_in", "ssm_in", "k_in", "v_in"], tensors) if t is not None]
    assert len(got) == len(want) == len(names)
    for n, x, y in zip(names, got, want):
        assert_rel_close(f"d{n}", x, y, 1e-6)
