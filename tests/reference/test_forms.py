"""The chunked form equals the recurrent definition in float64 (≤ 1e-12) for every feature combination."""
import itertools

import pytest
import torch

from mamba3.reference import mimo_chunked, mimo_recurrent, siso_chunked, siso_recurrent
from mamba3.testing.errors import assert_rel_close
from mamba3.testing.inputs import float64_copy, mimo_inputs, siso_inputs

TOL = 1e-12


def _compare(rec, chk, a, chunk_size):
    out_r, states_r = rec(**a)
    out_c, states_c = chk(**a, chunk_size=chunk_size)
    assert_rel_close("out", out_c, out_r, TOL)
    for name, x, ref in zip(("angle", "ssm", "k", "v"), states_c, states_r):
        assert_rel_close(f"final {name}", x, ref, TOL)


SISO_CASES = [
    dict(seqlen=t, states=s, with_D=dz, with_z=dz, shared_angles=sh, chunk=c)
    for t, c in ((1, 16), (17, 16), (200, 64), (45, 8))
    for s, dz, sh in itertools.product((False, True), (False, True), (False, True))
]


@pytest.mark.parametrize("case", SISO_CASES, ids=lambda c: "-".join(f"{k}{int(v)}" for k, v in c.items()))
def test_siso_chunked_equals_recurrent(case):
    case = dict(case)
    chunk = case.pop("chunk")
    a = float64_copy(siso_inputs(nheads=4, ngroups=2, dstate=16, headdim=8, nangles=5, **case))
    _compare(siso_recurrent, siso_chunked, a, chunk)


def test_siso_varlen_and_gqa_and_full_rotation():
    a = float64_copy(siso_inputs(bsz=1, seqlen=40, nheads=6, ngroups=3, dstate=8, nangles=4, states=True,
                                 cu_seqlens=[0, 1, 18, 40]))
    _compare(siso_recurrent, siso_chunked, a, 8)


MIMO_CASES = [
    dict(seqlen=t, rank=r, states=s, with_out=o, rms_norm=n, with_z=zz, chunk=c)
    for t, c in ((1, 16), (17, 16), (70, 8))
    for r in (1, 2, 4)
    for s, o, n, zz in ((False, True, False, True), (True, True, True, True), (True, False, False, True),
                        (False, False, True, False), (True, True, False, False))
]


@pytest.mark.parametrize("case", MIMO_CASES, ids=lambda c: "-".join(f"{k}{int(v)}" for k, v in c.items()))
def test_mimo_chunked_equals_recurrent(case):
    case = dict(case)
    chunk = case.pop("chunk")
    a = float64_copy(mimo_inputs(nheads=4, ngroups=2, dstate=16, headdim=8, **case))
    _compare(mimo_recurrent, mimo_chunked, a, chunk)


@pytest.mark.parametrize("nangles", [4, 8])          # rotary_dim_divisor 4 and 2 at N = 16
def test_mimo_varlen_shared_angles(nangles):
    a = float64_copy(mimo_inputs(bsz=1, seqlen=33, nangles=nangles, shared_angles=True, states=True,
                                 cu_seqlens=[0, 16, 17, 33]))
    _compare(mimo_recurrent, mimo_chunked, a, 8)


def test_decay_extremes_are_finite():
    """Strong decays (a ≪ 0) underflow cleanly instead of producing inf·0."""
    a = float64_copy(siso_inputs(seqlen=64, states=True))
    a["adt"] = a["adt"] * 1e3
    out, states = siso_chunked(**a, chunk_size=32)
    assert torch.isfinite(out).all() and all(torch.isfinite(s).all() for s in states)
    _compare(siso_recurrent, siso_chunked, a, 32)
