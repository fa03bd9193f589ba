"""torch.compile(fullgraph=True) traces the model (chunked ops and the decode step are custom ops with fake
implementations and autograd) and matches eager, forward and backward. CPU: backend "aot_eager" (tracing,
fake tensors, functionalization and the autograd graph, without the C++ code generation)."""
import pytest
import torch
import torch.nn.functional as F

from mamba3.modules import Mamba3Config, Mamba3LMHeadModel
from mamba3.ops import custom_ops
from mamba3.testing.errors import assert_rel_close
from mamba3.testing.inputs import mimo_inputs, siso_inputs


def tiny_lm(is_mimo):
    torch.manual_seed(0)
    cfg = Mamba3Config(d_model=32, n_layer=2, vocab_size=21, d_intermediate=32,
                       ssm_cfg=dict(d_state=16, headdim=8, is_mimo=is_mimo, mimo_rank=2, is_outproj_norm=is_mimo))
    return Mamba3LMHeadModel(cfg)


@pytest.mark.parametrize("is_mimo", [False, True], ids=["siso", "mimo"])
def test_compiled_model_forward_backward_matches_eager(is_mimo):
    torch._dynamo.reset()
    model = tiny_lm(is_mimo)
    x = torch.randint(0, 21, (2, 17), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")

    def loss_and_grads(m):
        model.zero_grad()
        logits = m(x[:, :-1]).logits[..., :21]
        loss = F.cross_entropy(logits.reshape(-1, 21), x[:, 1:].reshape(-1))
        loss.backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    le, ge = loss_and_grads(model)
    lc, gc = loss_and_grads(compiled)
    assert_rel_close("logits", lc, le, 1e-5)
    assert ge.keys() == gc.keys()
    for n in ge:
        assert_rel_close(f"d{n}", gc[n], ge[n], 1e-4)


@pytest.mark.parametrize("is_mimo", [False, True], ids=["siso", "mimo"])
def test_compiled_decode_step_matches_eager(is_mimo):
    torch._dynamo.reset()
    layer = tiny_lm(is_mimo).backbone.layers[0].mixer
    u = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(2))
    step = torch.compile(layer.step, fullgraph=True, backend="aot_eager")
    c1, c2 = layer.allocate_inference_cache(3, 4), layer.allocate_inference_cache(3, 4)
    with torch.no_grad():
        for t in range(4):
            assert_rel_close(f"step {t}", step(u[:, t:t + 1], c2), layer.step(u[:, t:t + 1], c1), 1e-6)
    for a, b in zip(c1, c2):
        assert_rel_close("state", b, a, 1e-6)


def test_custom_ops_pass_opcheck():
    a = siso_inputs(bsz=1, seqlen=5, nheads=2, ngroups=1, dstate=8, headdim=4, nangles=2, states=True)
    st = a.pop("input_states")
    args = (*[a[n] for n in ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "angles", "D", "z")], *st,
            None, None, "reference", "ieee")
    args = tuple(t.requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in args)
    torch.library.opcheck(custom_ops.siso_op, args, test_utils=("test_schema", "test_faketensor",
                                                                 "test_autograd_registration"))
    m = mimo_inputs(bsz=1, seqlen=5, nheads=2, ngroups=1, dstate=8, headdim=4, rank=2, states=True)
    st = m.pop("input_states")
    args = (*[m[n] for n in ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "mimo_v", "mimo_z",
                             "mimo_out", "angles", "D", "z")], *st, None, None, None, False, 1e-5, "reference", "ieee")
    torch.library.opcheck(custom_ops.mimo_op, args, test_utils=("test_schema", "test_faketensor",
                                                                 "test_autograd_registration"))


def test_custom_op_gradients_equal_the_public_function():
    a = siso_inputs(bsz=2, seqlen=9, states=True, seed=3)
    leaves = {n: t.clone().requires_grad_(True) for n, t in a.items() if isinstance(t, torch.Tensor)}
    st = tuple(s.clone().requires_grad_(True) for s in a["input_states"])
    args = dict(a, **leaves, input_states=st)
    out, fin = custom_ops.siso(**args, return_final_states=True, backend="reference")
    loss = out.square().sum() + fin[1].sum() + fin[0].sum()
    g1 = torch.autograd.grad(loss, [*leaves.values(), *st])
    import mamba3
    out2, fin2 = mamba3.mamba3_siso(**args, return_final_states=True, backend="reference")
    loss2 = out2.square().sum() + fin2[1].sum() + fin2[0].sum()
    g2 = torch.autograd.grad(loss2, [*leaves.values(), *st])
    for x, y in zip(g1, g2):
        assert_rel_close("grad", x, y, 1e-6)
