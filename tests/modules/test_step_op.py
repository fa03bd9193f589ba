"""The decode-step op (reference backend): token-by-token steps equal the recurrent definition with states,
for SISO and MIMO in every output mode; float64; validation."""
import math

import pytest
import torch

from mamba3.ops.step import mamba3_mimo_step, mamba3_siso_step
from mamba3.reference import mimo_recurrent, siso_recurrent
from mamba3.testing.errors import assert_rel_close
from mamba3.testing.inputs import float64_copy, mimo_inputs, siso_inputs


def run_siso_steps(a, backend="reference", **kw):
    states = tuple(s.clone() for s in a["input_states"])
    outs = [mamba3_siso_step(a["q"][:, t], a["k"][:, t], a["v"][:, t], a["adt"][:, :, t], a["dt"][:, :, t],
                             a["trap"][:, :, t], a["q_bias"], a["k_bias"], a["angles"][:, t], a["D"],
                             None if a["z"] is None else a["z"][:, t], states, backend=backend, **kw)
            for t in range(a["v"].shape[1])]
    return torch.stack(outs, dim=1), states


def run_mimo_steps(a, backend="reference", **kw):
    states = tuple(s.clone() for s in a["input_states"])
    outs = [mamba3_mimo_step(a["q"][:, t], a["k"][:, t], a["v"][:, t], a["adt"][:, :, t], a["dt"][:, :, t],
                             a["trap"][:, :, t], a["q_bias"], a["k_bias"], a["mimo_v"], a["mimo_z"], a["mimo_out"],
                             a["angles"][:, t], a["D"], None if a["z"] is None else a["z"][:, t], states,
                             rms_norm=a.get("rms_norm", False), norm_weight=a.get("norm_weight"), backend=backend,
                             **kw)
            for t in range(a["v"].shape[1])]
    return torch.stack(outs, dim=1), states


def check(out, states, ref_out, ref_states, tol):
    assert_rel_close("out", out, ref_out, tol)
    for name, got, want in zip(("angle", "ssm", "k", "v"), states, ref_states):
        assert_rel_close(f"{name} state", got, want, tol)
    assert (states[0] >= 0).all() and (states[0] < 2 * math.pi).all()


@pytest.mark.parametrize("shared", [False, True], ids=["per-head-angles", "shared-angles"])
@pytest.mark.parametrize("with_z", [True, False], ids=["z", "no-z"])
def test_siso_steps_equal_the_definition(shared, with_z):
    a = siso_inputs(bsz=2, seqlen=9, nheads=4, ngroups=2, dstate=16, headdim=8, nangles=4, states=True,
                    shared_angles=shared, with_z=with_z, seed=1)
    ref_out, ref_states = siso_recurrent(**float64_copy(a))
    out, states = run_siso_steps(a)
    check(out, states, ref_out, ref_states, 1e-5)


@pytest.mark.parametrize("mode", ["out", "per-rank", "rmsnorm", "rmsnorm-per-rank", "no-z"])
def test_mimo_steps_equal_the_definition(mode):
    a = mimo_inputs(bsz=2, seqlen=9, nheads=4, ngroups=2, dstate=16, headdim=8, rank=2, states=True,
                    with_out="per-rank" not in mode, rms_norm="rmsnorm" in mode, with_z=mode != "no-z",
                    shared_angles=mode == "out", seed=2)
    ref_out, ref_states = mimo_recurrent(**float64_copy(a))
    out, states = run_mimo_steps(a)
    check(out, states, ref_out, ref_states, 1e-5)


def test_float64_steps_are_exact():
    a = float64_copy(siso_inputs(seqlen=7, states=True, seed=3))
    ref_out, ref_states = siso_recurrent(**a)
    out, states = run_siso_steps(a, backend="auto")
    check(out, states, ref_out, ref_states, 1e-12)
    assert out.dtype == torch.float64


def test_bf16_inputs_fp32_states():
    a = mimo_inputs(seqlen=7, states=True, dtype=torch.bfloat16, seed=4)
    a["input_states"] = tuple(s.float() if i < 3 else s for i, s in enumerate(a["input_states"]))
    ref_out, ref_states = mimo_recurrent(**float64_copy(a))
    out, states = run_mimo_steps(a)
    assert out.dtype == torch.bfloat16 and states[1].dtype == torch.float32
    assert_rel_close("out", out, ref_out, 1e-2)
    assert_rel_close("ssm", states[1], ref_states[1], 1e-5)


def test_state_batch_indices_address_a_pool():
    a = siso_inputs(bsz=3, seqlen=4, states=True, seed=5)
    ref_out, ref_states = siso_recurrent(**a)
    pool = [torch.zeros((7,) + s.shape[1:], dtype=s.dtype) for s in a["input_states"]]
    idx = torch.tensor([6, 1, 3])
    for p, s in zip(pool, a["input_states"]):
        p[idx] = s
    b = dict(a, input_states=tuple(pool))
    out, states = run_siso_steps(b, state_batch_indices=idx)
    assert_rel_close("out", out, ref_out, 1e-5)
    for got, want in zip(states, ref_states):
        assert_rel_close("pooled state", got[idx], want, 1e-5)
        assert float(got[torch.tensor([0, 2, 4, 5])].abs().max()) == 0.0


def test_validation_messages():
    a = siso_inputs(bsz=2, seqlen=1, states=True)
    args = [a["q"][:, 0], a["k"][:, 0], a["v"][:, 0], a["adt"][:, :, 0], a["dt"][:, :, 0], a["trap"][:, :, 0],
            a["q_bias"], a["k_bias"], a["angles"][:, 0], a["D"], a["z"][:, 0]]
    st = a["input_states"]
    with pytest.raises(ValueError, match="states ssm"):
        mamba3_siso_step(*args, (st[0], st[1][..., :-1], st[2], st[3]))
    with pytest.raises(ValueError, match="state_batch_indices"):
        mamba3_siso_step(*args, st, state_batch_indices=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="adt"):
        mamba3_siso_step(*args[:3], args[3][:, :1], *args[4:], st)
    with pytest.raises(TypeError, match="fp32"):
        mamba3_siso_step(*args, (st[0].half(), st[1], st[2], st[3]))
    with pytest.raises(ValueError, match="rows"):
        mamba3_siso_step(*args, tuple(s[:1] for s in st))
    with pytest.raises(ValueError, match="backend"):
        mamba3_siso_step(*args, st, backend="cuda")
