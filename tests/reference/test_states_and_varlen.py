"""Continuing a sequence from final states equals one pass; packed varlen equals separate runs."""
import pytest
import torch

from mamba3.reference import mimo_chunked, siso_chunked
from mamba3.testing.errors import assert_rel_close
from mamba3.testing.inputs import float64_copy, mimo_inputs, siso_inputs

TOL = 1e-12
PER_TOKEN = ("q", "k", "v", "z", "angles")          # (B, T, …)
PER_STEP = ("adt", "dt", "trap")                      # (B, H, T)


def _time_slice(a, sl):
    out = dict(a)
    for name in PER_TOKEN:
        if out.get(name) is not None:
            out[name] = out[name][:, sl]
    for name in PER_STEP:
        out[name] = out[name][:, :, sl]
    return out


def _batch_slice(a, i):
    out = {k: (v[i:i + 1] if k in PER_TOKEN + PER_STEP and v is not None else v) for k, v in a.items()}
    if a.get("input_states") is not None:
        out["input_states"] = tuple(s[i:i + 1] for s in a["input_states"])
    return out


@pytest.mark.parametrize("op", ["siso", "mimo"])
@pytest.mark.parametrize("split", [1, 20, 32, 47])
@pytest.mark.parametrize("with_states", [False, True])
def test_split_sequence_equals_one_pass(op, split, with_states):
    fn, make = (siso_chunked, siso_inputs) if op == "siso" else (mimo_chunked, mimo_inputs)
    a = float64_copy(make(seqlen=48, states=with_states, seed=11))
    out, states = fn(**a, chunk_size=16)
    first, second = _time_slice(a, slice(None, split)), _time_slice(a, slice(split, None))
    out1, states1 = fn(**first, chunk_size=16)
    out2, states2 = fn(**dict(second, input_states=states1), chunk_size=16)
    assert_rel_close("out", torch.cat([out1, out2], dim=1), out, TOL)
    for name, x, ref in zip(("angle", "ssm", "k", "v"), states2, states):
        assert_rel_close(f"final {name}", x, ref, TOL)


@pytest.mark.parametrize("op", ["siso", "mimo"])
def test_split_gradients_equal_one_pass(op):
    fn, make = (siso_chunked, siso_inputs) if op == "siso" else (mimo_chunked, mimo_inputs)
    a = float64_copy(make(seqlen=24, states=True, seed=12))
    v_one = a["v"].clone().requires_grad_(True)
    out, _ = fn(**dict(a, v=v_one), chunk_size=8)
    (g_one,) = torch.autograd.grad(out.square().sum(), v_one)
    v_two = a["v"].clone().requires_grad_(True)
    b = dict(a, v=v_two)
    out1, st1 = fn(**_time_slice(b, slice(None, 10)), chunk_size=8)
    out2, _ = fn(**dict(_time_slice(b, slice(10, None)), input_states=st1), chunk_size=8)
    (g_two,) = torch.autograd.grad(out1.square().sum() + out2.square().sum(), v_two)
    assert_rel_close("dv", g_two, g_one, TOL)


@pytest.mark.parametrize("op", ["siso", "mimo"])
@pytest.mark.parametrize("with_states", [False, True])
def test_varlen_equals_separate_sequences(op, with_states):
    fn, make = (siso_chunked, siso_inputs) if op == "siso" else (mimo_chunked, mimo_inputs)
    lengths = [5, 1, 19, 16]
    bounds = torch.tensor([0, *lengths]).cumsum(0).tolist()
    packed = float64_copy(make(bsz=1, seqlen=sum(lengths), cu_seqlens=bounds, states=with_states, seed=13))
    out, states = fn(**packed, chunk_size=8)
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        one = _time_slice(dict(packed, cu_seqlens=None), slice(s, e))
        if with_states:
            one["input_states"] = tuple(x[i:i + 1] for x in packed["input_states"])
        out_i, states_i = fn(**one, chunk_size=8)
        assert_rel_close(f"out of sequence {i}", out[:, s:e], out_i, TOL)
        for name, x, ref in zip(("angle", "ssm", "k", "v"), states, states_i):
            assert_rel_close(f"final {name} of sequence {i}", x[i:i + 1], ref, TOL)


@pytest.mark.parametrize("op", ["siso", "mimo"])
def test_batch_rows_are_independent(op):
    fn, make = (siso_chunked, siso_inputs) if op == "siso" else (mimo_chunked, mimo_inputs)
    a = float64_copy(make(bsz=3, seqlen=20, states=True, seed=14))
    out, _ = fn(**a, chunk_size=8)
    for i in range(3):
        out_i, _ = fn(**_batch_slice(a, i), chunk_size=8)
        assert_rel_close(f"row {i}", out[i:i + 1], out_i, TOL)
