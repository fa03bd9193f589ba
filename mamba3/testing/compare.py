"""One implementation of an op against the float64 reference on the same inputs: the output, the four final
states and the gradient of every floating input (input states included), through one fixed random upstream
gradient on the output and all final states. Used by the interpreter, GPU and reference tests.

``fn`` and ``ref_fn`` take the keyword arguments made by :mod:`mamba3.testing.inputs` and return
``(out, final_states)``.
"""
from __future__ import annotations

import torch

from .errors import rel_frobenius
from .inputs import float64_copy, replace_leaves, tensor_leaves

#: the accuracy contract per input dtype: (output and final-state bar, gradient bar)
TOLERANCES = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (3e-3, 1e-2), torch.float16: (3e-3, 1e-2)}
STATE_NAMES = ("angle", "ssm", "k", "v")


def upstream_grads(out, finals, seed=1234):
    """A fixed random upstream gradient for the output and each final state (float64, CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in (out, *finals)]


def with_grads(fn, args, upstream=None):
    """fn(**args) on fresh leaves, backward through ``upstream`` (made by upstream_grads when None; an entry
    None leaves that result out of the loss, so its gradient enters backward as None).

    Returns (out, finals, {leaf name: gradient}, upstream), all detached."""
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in tensor_leaves(args)}
    out, finals = fn(**replace_leaves(args, leaves))
    upstream = upstream_grads(out, finals) if upstream is None else upstream
    loss = sum((x.double() * u.to(x.device)).sum() for x, u in zip((out, *finals), upstream) if u is not None)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return out.detach(), [f.detach() for f in finals], dict(zip(leaves, grads)), upstream


def errors(got, want) -> dict[str, float]:
    """{out, final_<state>, d_<input>: relative Frobenius error} between two with_grads results."""
    out, finals, grads, _ = got
    r_out, r_finals, r_grads, _ = want
    errs = {"out": rel_frobenius(out, r_out)}
    for name, x, y in zip(STATE_NAMES, finals, r_finals):
        errs[f"final_{name}"] = rel_frobenius(x, y)
    for name, g in r_grads.items():
        if g is not None:
            errs[f"d_{name}"] = float("inf") if grads.get(name) is None else rel_frobenius(grads[name], g)
    return errs


def compare(fn, ref_fn, args, reference=None) -> dict[str, float]:
    """Errors of fn(**args) against ref_fn on the float64 copy of args (``reference``: a cached with_grads
    result of the reference, to compare several configurations against one reference run)."""
    reference = with_grads(ref_fn, float64_copy(args)) if reference is None else reference
    return errors(with_grads(fn, args, upstream=reference[3]), reference)


def assert_within_contract(errs, dtype, tols=None):
    """Every error within the dtype's bars (or ``tols`` = (output bar, gradient bar), for documented opt-ins)."""
    out_tol, grad_tol = tols or TOLERANCES[dtype]
    bad = {k: v for k, v in errs.items() if not v <= (grad_tol if k.startswith("d_") else out_tol)}
    detail = ", ".join(f"{k}={v:.1e}" for k, v in errs.items())
    assert not bad, (f"errors above the {dtype} contract (out ≤ {out_tol}, grads ≤ {grad_tol}): "
                     + ", ".join(f"{k}={v:.2e}" for k, v in sorted(bad.items())) + f" | all: {detail}")
