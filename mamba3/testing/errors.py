"""Error measures used by every numerical test and by ``python -m mamba3 check``."""

from __future__ import annotations

import torch


def rel_frobenius(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref||_F / ||ref||_F, computed in float64 on the CPU.

    If ``ref`` is all zeros, returns ||x||_F (the absolute error). NaN/inf anywhere gives NaN/inf, never a pass.
    """
    if x.shape != ref.shape:
        raise ValueError(f"shape mismatch: {tuple(x.shape)} vs reference {tuple(ref.shape)}")
    xd = x.detach().to(device="cpu", dtype=torch.float64)
    rd = ref.detach().to(device="cpu", dtype=torch.float64)
    num = torch.linalg.vector_norm(xd - rd).item()
    den = torch.linalg.vector_norm(rd).item()
    if den == 0.0:
        return num
    return num / den


def assert_rel_close(name: str, x: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    """Assert rel_frobenius(x, ref) <= tol; the message names the tensor and gives the numbers. Returns the error."""
    err = rel_frobenius(x, ref)
    if not err <= tol:  # also catches NaN
        diff = (x.detach().to("cpu", torch.float64) - ref.detach().to("cpu", torch.float64)).abs()
        max_abs = diff.max().item() if diff.numel() else 0.0
        raise AssertionError(
            f"{name}: relative Frobenius error {err:.3e} > tol {tol:.1e} "
            f"(shape {tuple(x.shape)}, dtype {x.dtype} vs reference {ref.dtype}, max abs error {max_abs:.3e})"
        )
    return err
