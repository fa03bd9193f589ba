"""RMS norm on the GPU: the autograd Function and its launchers (kernels: ``kernel.py``, tiles: ``configs.py``).

Forward one launch, backward one launch plus the sum of the programs' weight-gradient partials: where the PyTorch
composition dispatches ≈ 6 ops forward and ≈ 17 backward per norm (the task models' training steps are
launch-bound; benchmarks/host_ops_task_step.py counts them).
"""
from __future__ import annotations

import torch
import triton

from ..checks import on_device_of
from ..common.launch import launch
from .configs import choose_config
from .kernel import rms_norm_bwd_kernel, rms_norm_fwd_kernel

_BWD_PROGRAMS_PER_SM = 4  # backward programs per SM (each walks row blocks); 512 when the SM count is unknown


class RmsNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, z, eps, group_size):
        width = x.shape[-1]
        cfg = choose_config(width // group_size, group_size)
        x2 = _rows(x)
        z2 = None if z is None else z.reshape(-1, width).contiguous()
        rows = x2.shape[0]
        y = torch.empty(rows, width, device=x.device, dtype=x.dtype)
        rstd = torch.empty(rows, width // group_size, device=x.device, dtype=torch.float32)
        launch(rms_norm_fwd_kernel, (triton.cdiv(rows, cfg.block_m),), x2, weight, z2, y, rstd, rows, x2.stride(0),
               width // group_size, group_size, eps, BLOCK_M=cfg.block_m, BLOCK_G=cfg.block_g, BLOCK_D=cfg.block_d,
               HAS_W=weight is not None, HAS_Z=z is not None, num_warps=cfg.num_warps, num_stages=1)
        ctx.save_for_backward(x2, weight, z2, rstd)
        ctx.cfg, ctx.group_size, ctx.shape = cfg, group_size, x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, z2, rstd = ctx.saved_tensors
        cfg, group_size = ctx.cfg, ctx.group_size
        rows, width = x2.shape
        dy2 = dy.reshape(-1, width).contiguous()
        nblocks = triton.cdiv(rows, cfg.block_m)
        nprog = max(1, min(nblocks, _bwd_program_cap(x2.device)))
        dx = torch.empty(rows, width, device=x2.device, dtype=x2.dtype)
        dz = None if z2 is None else torch.empty_like(z2)
        dw_part = None if weight is None else torch.empty(nprog, width, device=x2.device, dtype=torch.float32)
        launch(rms_norm_bwd_kernel, (nprog,), x2, weight, z2, dy2, rstd, dx, dz, dw_part, rows, nblocks,
               x2.stride(0), width // group_size, group_size, BLOCK_M=cfg.block_m, BLOCK_G=cfg.block_g, BLOCK_D=cfg.block_d,
               HAS_W=weight is not None, HAS_Z=z2 is not None, num_warps=cfg.num_warps, num_stages=1)
        dw = None if weight is None else dw_part.sum(0).to(weight.dtype)
        return (dx.reshape(ctx.shape), dw, None if dz is None else dz.reshape(ctx.shape), None, None)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, W) with unit column stride: a view where one exists (e.g. a slice of a wider projection's
    output, read in place with its row stride), else a contiguous copy."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _bwd_program_cap(device: torch.device) -> int:
    if device.type != "cuda":
        return 512
    from mamba3.dispatch import device_spec

    sms = device_spec(device).sm_count
    return 512 if sms is None else _BWD_PROGRAMS_PER_SM * sms


@on_device_of
def rms_norm_triton(x, weight, z, eps: float, group_size: int):
    """The Triton RMS norm (inputs validated by ``api.rms_norm``); runs with x's device current."""
    return RmsNormFunction.apply(x, weight, z, eps, group_size)
