"""The RMS norm kernels on CUDA against the float64 reference: every input dtype, whole rows and headwise groups,
with and without weight and gate, strided rows, padded groups / dims, one row per program up to the widest row
a program holds, the backward's programs walking several row blocks; "auto" leaves wider rows to the reference;
the modules' norms take the kernels."""
import pytest
import torch

from mamba3.modules import RMSNorm, RMSNormGated
from mamba3.ops.rms_norm import function as norm_function
from mamba3.ops.rms_norm import rms_norm
from mamba3.ops.rms_norm.configs import MAX_ROW
from mamba3.reference import rms_norm as rms_norm_reference
from mamba3.testing.compare import TOLERANCES
from mamba3.testing.errors import rel_frobenius

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"

CASES = [  # (lead shape, groups, group size, weight, gate)
    ((4, 1000), 1, 64, True, False),
    ((2, 3000), 1, 32, True, False),
    ((1, 9000, 4), 1, 128, True, False),
    ((2, 777), 8, 16, True, True),
    ((3, 100), 24, 64, True, True),
    ((5, 13), 3, 24, True, True),
    ((4, 7), 1, 40, False, True),
    ((2, 300), 1, 4096, True, False),
    ((37,), 1, MAX_ROW, True, True),
]


def _errors(lead, groups, size, has_w, has_z, dtype, strided=False):
    g = torch.Generator().manual_seed(0)
    width = groups * size
    wide = (torch.randn(*lead, width + (48 if strided else 0), generator=g) * 3 + 0.5).to(dtype)
    w = 1 + 0.5 * torch.randn(width, generator=g) if has_w else None
    z = torch.randn(*lead, width, generator=g).to(dtype) if has_z else None
    up = torch.randn(*lead, width, generator=g, dtype=torch.float64)
    out = {}
    for name, dev, cast in (("kernel", DEV, lambda t: t), ("reference", "cpu", lambda t: t.double())):
        leaves = [None if t is None else cast(t).detach().to(dev).requires_grad_(True) for t in (wide, w, z)]
        x = leaves[0][..., 16:16 + width] if strided else leaves[0]
        if name == "kernel":
            y = rms_norm(x, leaves[1], 1e-5, size, leaves[2], backend="triton")
            assert y.dtype == dtype and y.is_cuda
        else:
            y = rms_norm_reference(x, leaves[1], 1e-5, size, leaves[2])
        (y.double() * up.to(dev)).sum().backward()
        out[name] = [y.detach().cpu().double()] + [t.grad.cpu().double() for t in leaves if t is not None]
    names = ["out", "d_x"] + (["d_weight"] if has_w else []) + (["d_z"] if has_z else [])
    return {n: rel_frobenius(a, b) for n, a, b in zip(names, out["kernel"], out["reference"])}


def _check(errs, dtype):
    out_bar, grad_bar = TOLERANCES[dtype]
    bad = {k: v for k, v in errs.items() if not v <= (grad_bar if k.startswith("d_") else out_bar)}
    assert not bad, f"above the {dtype} contract: {bad} | all: {errs}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lead,groups,size,has_w,has_z", CASES)
def test_rms_norm_matches_the_float64_reference(lead, groups, size, has_w, has_z, dtype):
    _check(_errors(lead, groups, size, has_w, has_z, dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_rows(dtype):
    _check(_errors((3, 500), 1, 64, True, False, dtype, strided=True), dtype)


def test_backward_programs_walk_several_row_blocks(monkeypatch):
    monkeypatch.setattr(norm_function, "_bwd_program_cap", lambda device: 3)
    _check(_errors((4, 1000), 8, 16, True, True, torch.float32), torch.float32)


def test_auto_leaves_wider_rows_to_the_reference():
    x = torch.randn(3, 2 * MAX_ROW, device=DEV)
    w = torch.rand(2 * MAX_ROW, device=DEV)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5), rtol=0, atol=0)
    with pytest.raises(ValueError, match="at most"):
        rms_norm(x, w, 1e-5, backend="triton")


def test_module_norms_run_the_kernels(monkeypatch):
    calls = []
    real = norm_function.RmsNormFunction.apply
    monkeypatch.setattr(norm_function.RmsNormFunction, "apply", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(2, 10, 64, device=DEV)
    RMSNorm(64, device=DEV)(x)
    RMSNormGated(64, group_size=16, device=DEV)(x, torch.randn_like(x))
    assert len(calls) == 2
