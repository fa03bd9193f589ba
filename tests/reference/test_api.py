"""Public API on the reference backend: validation, dtypes, precision bars, and the official signatures."""
import functools

import pytest
import torch

import mamba3
from mamba3.compat import mamba3_mimo as compat_mimo
from mamba3.compat import mamba3_siso_combined
from mamba3.reference import mimo_recurrent, siso_recurrent
from mamba3.testing.compare import assert_within_contract, compare
from mamba3.testing.inputs import float64_copy, mimo_inputs, siso_inputs

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", ["siso", "mimo"])
def test_reference_backend_meets_precision_bars(op, dtype):
    if op == "siso":
        a = siso_inputs(seqlen=70, states=True, dtype=dtype, seed=21)
        fn, ref = mamba3.mamba3_siso, siso_recurrent
    else:
        a = mimo_inputs(seqlen=70, states=True, rms_norm=True, dtype=dtype, seed=22)
        fn, ref = mamba3.mamba3_mimo, mimo_recurrent
    assert fn(**a, backend="reference").dtype == dtype
    errs = compare(functools.partial(fn, backend="reference", return_final_states=True), ref, a)
    assert_within_contract(errs, dtype)


def test_final_state_dtypes():
    a = siso_inputs(dtype=torch.bfloat16, states=True)
    out, (angle, ssm, k, v) = mamba3.mamba3_siso(**a, return_final_states=True)
    assert out.dtype == v.dtype == torch.bfloat16
    assert angle.dtype == ssm.dtype == k.dtype == torch.float32
    a = float64_copy(a)
    _, states = mamba3.mamba3_siso(**a, return_final_states=True)
    assert all(s.dtype == torch.float64 for s in states)


def test_compat_siso_matches_the_api():
    a = siso_inputs(states=True)
    result = mamba3_siso_combined(a["q"], a["k"], a["v"], a["adt"], a["dt"], a["trap"], a["q_bias"], a["k_bias"],
                                  a["angles"], a["D"], a["z"], a["input_states"], chunk_size=16,
                                  return_final_states=True)
    out, states = mamba3.mamba3_siso(**a, chunk_size=16, return_final_states=True)
    assert len(result) == 5 and result[0].dtype == torch.float32
    for x, ref in zip(result, (out, *states)):
        torch.testing.assert_close(x, ref)


@pytest.mark.parametrize("divisor", [2, 4])
def test_compat_mimo_matches_the_api(divisor):
    a = mimo_inputs(nangles=16 // divisor, rms_norm=True)
    result = compat_mimo(a["q"], a["k"], a["v"], a["adt"], a["dt"], a["trap"], a["q_bias"], a["k_bias"],
                         a["mimo_v"], a["mimo_z"], a["mimo_out"], a["angles"], a["D"], a["z"], 16, divisor,
                         torch.float32, return_state=True, fuse_pregate_headwise_rms_norm=True,
                         outproj_norm_weight=a["norm_weight"].flatten())
    out, states = mamba3.mamba3_mimo(**a, chunk_size=16, return_final_states=True)
    for x, ref in zip(result, (out, *states)):
        torch.testing.assert_close(x, ref)
    with pytest.raises(ValueError, match="rotary_dim_divisor"):
        compat_mimo(a["q"], a["k"], a["v"], a["adt"], a["dt"], a["trap"], a["q_bias"], a["k_bias"], a["mimo_v"],
                    a["mimo_z"], a["mimo_out"], a["angles"], a["D"], a["z"], 16, 6 - divisor, None)


@pytest.mark.parametrize("mutate, message", [
    (lambda a: a.update(q=a["q"][..., :15], k=a["k"][..., :15]), "must be even"),
    (lambda a: a.update(q=a["q"][:, :, :1].expand(-1, -1, 3, -1), k=a["k"][:, :, :1].expand(-1, -1, 3, -1)),
     "multiple of the number of q/k groups"),
    (lambda a: a.update(adt=a["adt"][:, :, :-1]), "adt must have shape"),
    (lambda a: a.update(angles=torch.zeros(2, 37, 4, 9)), "at most N/2"),
    (lambda a: a.update(D=torch.ones(3)), "D must have shape"),
    (lambda a: a.update(cu_seqlens=torch.tensor([0, 37])), "batch size 1"),
    (lambda a: a.update(input_states=a["input_states"][:3]), "4 tensors"),
    (lambda a: a.update(chunk_size=24), "power of two"),
    (lambda a: a.update(backend="cuda"), "backend must be one of"),
    (lambda a: a.update(precision="fp16"), "precision must be one of"),
    (lambda a: a.update(q_bias=a["q_bias"][:1]), "q_bias must have shape"),
])
def test_siso_validation_errors(mutate, message):
    a = siso_inputs(states=True)
    mutate(a)
    with pytest.raises((ValueError, TypeError), match=message):
        mamba3.mamba3_siso(**a)


def test_varlen_validation():
    a = siso_inputs(bsz=1, seqlen=10, cu_seqlens=[0, 4, 4, 10])
    with pytest.raises(ValueError, match="length ≥ 1"):
        mamba3.mamba3_siso(**a)
    a = siso_inputs(bsz=1, seqlen=10, cu_seqlens=[0, 4, 9])
    with pytest.raises(ValueError, match="end at T=10"):
        mamba3.mamba3_siso(**a)


def test_mimo_validation_errors():
    a = mimo_inputs()
    with pytest.raises(ValueError, match="mimo_v must have shape"):
        mamba3.mamba3_mimo(**dict(a, mimo_v=a["mimo_v"][:, :1]))
    with pytest.raises(ValueError, match="rms_norm=False"):
        mamba3.mamba3_mimo(**dict(a, norm_weight=torch.ones(4, 8)))


def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        mamba3.mamba3_siso(**siso_inputs(), backend="triton")
