"""The RMS norm kernels under the interpreter, against the float64 reference: output and every gradient (x,
weight, gate), whole rows and headwise groups, with and without weight and gate, rows that do not fill a tile and
groups / dims that are not powers of two, and a backward whose programs walk several row blocks each."""
import pytest
import torch

from mamba3.ops.rms_norm import function as norm_function
from mamba3.ops.rms_norm import rms_norm
from mamba3.reference import rms_norm as rms_norm_reference
from mamba3.testing.compare import TOLERANCES
from mamba3.testing.errors import rel_frobenius

CASES = [  # (lead shape, groups, group size, weight, gate)
    ((3, 37), 1, 64, True, False),  # the task models' block norms: rows not filling a tile
    ((2, 9, 4), 1, 16, True, False),  # the layer's B/C norms over N (a 4-D input)
    ((2, 21), 8, 16, True, True),  # the headwise norm before the gate
    ((5,), 3, 24, True, True),  # 3 groups of 24: both padded to powers of two
    ((4, 7), 1, 40, False, True),  # no weight
    ((33,), 1, 2048, True, False),  # one row per program
]


def _run(fn, x, w, z, eps, size, upstream):
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, w, z)]
    y = fn(*leaves, eps, size)
    grads = torch.autograd.grad((y.double() * upstream).sum(), [t for t in leaves if t is not None])
    return y.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lead,groups,size,has_w,has_z", CASES)
def test_rms_norm_matches_the_float64_reference(lead, groups, size, has_w, has_z, dtype):
    g = torch.Generator().manual_seed(0)
    width = groups * size
    x = (torch.randn(*lead, width, generator=g) * 3 + 0.5).to(dtype)
    w = 1 + 0.5 * torch.randn(width, generator=g) if has_w else None
    z = torch.randn(*lead, width, generator=g).to(dtype) if has_z else None
    up = torch.randn(*lead, width, generator=g, dtype=torch.float64)

    def triton_fn(x, w, z, eps, size):
        return rms_norm(x, w, eps, size, z, backend="triton")

    def reference_fn(x, w, z, eps, size):
        return rms_norm_reference(x, w, eps, size, z)

    got = _run(triton_fn, x, w, z, 1e-5, size, up)
    want = _run(reference_fn, *(t.double() if t is not None else None for t in (x, w, z)), 1e-5, size, up)
    assert got[0].dtype == dtype
    names = ["x"] + (["weight"] if has_w else []) + (["z"] if has_z else [])
    errs = {"out": rel_frobenius(got[0], want[0])} | {f"d_{n}": rel_frobenius(a, b)
                                                        for n, a, b in zip(names, got[1], want[1])}
    out_bar, grad_bar = TOLERANCES[dtype]
    bad = {k: v for k, v in errs.items() if not v <= (grad_bar if k.startswith("d_") else out_bar)}
    assert not bad, f"above the {dtype} contract: {bad} | all: {errs}"


def test_backward_programs_walk_several_row_blocks(monkeypatch):
    """With the backward's programs capped at 2, each walks several row blocks and sums their weight gradient:
    the same gradients as one program per block, to rounding."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 64, generator=g)
    w = torch.randn(64, generator=g)
    up = torch.randn(300, 64, generator=g)

    def grads():
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        (rms_norm(xs, ws, 1e-5, backend="triton") * up).sum().backward()
        return xs.grad, ws.grad

    wide = grads()
    monkeypatch.setattr(norm_function, "_bwd_program_cap", lambda device: 2)
    narrow = grads()
    torch.testing.assert_close(narrow[0], wide[0], rtol=0, atol=0)
    torch.testing.assert_close(narrow[1], wide[1], rtol=1e-6, atol=1e-6)


def test_invalid_arguments_are_refused():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="group_size"):
        rms_norm(x, None, 1e-5, 24, backend="triton")
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(32), 1e-5, backend="triton")
    with pytest.raises(ValueError, match="z must"):
        rms_norm(x, None, 1e-5, z=torch.randn(4, 32), backend="triton")
    with pytest.raises(ValueError, match="at most"):
        rms_norm(torch.randn(2, 8200), None, 1e-5, backend="triton")


def test_strided_rows_are_read_in_place():
    """A slice of a wider projection (rows strided, as the layer's B and C) is read in place and gives what its
    contiguous copy gives, output and gradient, bit for bit."""
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(2, 21, 200, generator=g)
    w = torch.randn(64, generator=g)
    up = torch.randn(2, 21, 64, generator=g)
    results = []
    for copy in (False, True):
        leaf = wide.clone().requires_grad_(True)
        x = leaf[..., 100:164]
        x = x.contiguous() if copy else x
        y = rms_norm(x, w, 1e-5, backend="triton")
        (y * up).sum().backward()
        results.append((y.detach(), leaf.grad))
    assert wide[..., 100:164].reshape(-1, 64).stride(0) == 200  # the kernel saw the strided rows
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)
