"""SISO adapters of :mod:`mamba3.testing.compare` used by the tests (interpreter and GPU lanes): short-named
input cases, ``siso_triton`` called with an inputs dict, and the kernel-vs-float64-reference check."""
from __future__ import annotations

import torch

from mamba3.testing.compare import assert_within_contract, compare


def make_case(dtype=torch.float32, B=2, T=17, H=2, G=1, N=16, P=16, A=4, states=False, shared=False, cu=None,
              D=True, Z=True, seed=0, device="cpu"):
    """SISO inputs (a keyword-argument dict) with the short names these tests use."""
    from mamba3.testing.inputs import siso_inputs

    return siso_inputs(bsz=B, seqlen=T, nheads=H, ngroups=G, dstate=N, headdim=P, nangles=A, dtype=dtype,
                       device=device, states=states, shared_angles=shared, cu_seqlens=cu, with_D=D, with_z=Z,
                       seed=seed)


def siso_kernel(chunk_size, precision="ieee", save_states=False):
    """siso_triton with the keyword arguments of an inputs dict; checks that the output keeps v's dtype."""
    from .function import siso_triton

    def run(**a):
        out, states = siso_triton(a["q"], a["k"], a["v"], a["adt"], a["dt"], a["trap"], a["q_bias"], a["k_bias"],
                                  a["angles"], a.get("D"), a.get("z"), a.get("input_states"), chunk_size,
                                  a.get("cu_seqlens"), precision, save_states=save_states)
        assert out.dtype == a["v"].dtype
        return out, states
    return run


def run_and_compare(args, chunk_size, reference=None, precision="ieee", tols=None, save_states=False):
    """siso_triton against the float64 reference (default: the recurrent definition) on the same inputs: output,
    final states and every gradient; asserts the dtype's bars (or ``tols`` = (output, gradient))."""
    from mamba3.reference import siso_recurrent

    errs = compare(siso_kernel(chunk_size, precision, save_states), reference or siso_recurrent, args)
    assert_within_contract(errs, args["v"].dtype, tols)
    print(", ".join(f"{k}={e:.2e}" for k, e in errs.items()))
    return errs


def assert_same_results(got, want, near=(), tol=1e-6, exact_forward=True, context="") -> dict:
    """Two ``with_grads`` runs that must agree: the output, the final states and every gradient bit for bit, but
    the gradients named in ``near`` (or every one, ``near="all"``; sums taken in another order), which must lie
    within ``tol`` relative Frobenius error of each other, and without ``exact_forward`` the output and final states
    too. A gradient present in one run is present in the other. Returns the errors of the near gradients by name;
    ``context`` ends every failure message (e.g. " with flag_name")."""
    from mamba3.testing.errors import rel_frobenius

    for name, a, b in [("output", got[0], want[0])] + [(f"final state {i}", a, b)
                                                       for i, (a, b) in enumerate(zip(got[1], want[1]))]:
        if exact_forward:
            assert torch.equal(a, b), f"{name} differs{context}"
        else:
            err = rel_frobenius(a, b)
            assert err < tol, f"{name} differs by {err:.2e}{context}"
    errs = {}
    for name in want[2]:
        assert (got[2][name] is None) == (want[2][name] is None), f"d_{name}{context}"
        if want[2][name] is None:
            continue
        if near == "all" or name in near:
            errs[name] = rel_frobenius(got[2][name], want[2][name])
            assert errs[name] < tol, f"d_{name} differs by {errs[name]:.2e}{context}"
        else:
            assert torch.equal(got[2][name], want[2][name]), f"d_{name}{context}"
    return errs


def force_config(monkeypatch, **changes):
    """Within a test: every SISO call runs the dispatcher's configuration with ``changes`` applied."""
    import dataclasses

    from . import function as F

    choose = F.choose_config
    monkeypatch.setattr(F, "choose_config", lambda spec, problem: dataclasses.replace(choose(spec, problem), **changes))


def launched_kernels(monkeypatch) -> list:
    """Within a test: the names of the kernels the SISO Function launches, in order (they still run)."""
    from . import function as F

    names, launch = [], F.launch

    def record(kernel, *args, **meta):
        names.append(kernel.fn.__name__)
        launch(kernel, *args, **meta)

    monkeypatch.setattr(F, "launch", record)
    return names
