"""RMS norm tiles (no autotuning: a pure function of the row's shape).

A program holds BLOCK_M rows × BLOCK_G groups × BLOCK_D dims (powers of two covering G and D). Rows are short in
this package (the task models' d_model 32-64, the layer's B/C norms over N, the headwise norm over d_inner), so a
program takes several rows: about 2048 elements per program at 4 warps (16 fp32 values per thread per tensor;
the backward keeps ≈ 6 such tensors live), and wider rows one row per program with more warps, up to 8192
elements at 16 warps (AOT, sm_80-120: 4 B of spills at most, the fp32 backward on sm_90; 16384 at 16 warps
spilled ≈ 780 B per thread in the backward).
``api.rms_norm`` leaves wider rows to the reference ("auto") or refuses them ("triton"). No shared memory beyond
the reductions' scratch, so every configuration fits every architecture (the AOT lane checks it).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from mamba3.dispatch import DeviceSpec

from ..step.configs import next_pow2

MAX_ROW = 8192  # elements of one row (G·D, padded to powers of two) a program can hold
TILE_ELEMENTS = 2048  # elements per program for short rows (several rows per program)


@dataclass(frozen=True)
class RmsNormConfig:
    block_m: int  # rows per program
    block_g: int  # groups per row, padded to a power of two
    block_d: int  # dims per group, padded to a power of two
    num_warps: int  # 4 up to 2048 elements per program, then one warp per 512 elements (16 fp32 per thread)


@functools.lru_cache(maxsize=None)
def choose_config(groups: int, group_size: int) -> RmsNormConfig:
    bg, bd = next_pow2(groups), next_pow2(group_size)
    width = bg * bd
    if width > MAX_ROW:
        raise ValueError(f"the Triton RMS norm holds rows of at most {MAX_ROW} elements (groups and group size "
                         f"padded to powers of two), got {groups} × {group_size}; use backend='reference'")
    block_m = max(1, TILE_ELEMENTS // width)
    return RmsNormConfig(block_m=block_m, block_g=bg, block_d=bd,
                         num_warps=min(16, max(4, block_m * width // 512)))


# (name, groups, group size, dtype, weight, gate): the task models' block norms (d_model 64), the layer's B/C norms
# (N = 128), the headwise norm before the gate (8 heads of 16), and the widest row a program takes, in 16-bit and
# fp32 inputs
_AOT_PROBLEMS = (
    ("rows64-fp32", 1, 64, torch.float32, True, False),
    ("rows128-bf16", 1, 128, torch.bfloat16, True, False),
    ("heads8x16-gated-fp32", 8, 16, torch.float32, True, True),
    ("heads8x16-gated-bf16", 8, 16, torch.bfloat16, True, True),
    ("rows64-noweight-fp32", 1, 64, torch.float32, False, False),
    (f"rows{MAX_ROW}-fp32", 1, MAX_ROW, torch.float32, True, True),
    (f"rows{MAX_ROW}-bf16", 1, MAX_ROW, torch.bfloat16, True, True),
)


def aot_launches(arch: int):
    from ...testing.aot import KernelLaunch
    from ..common.launch import recording
    from .function import rms_norm_triton

    out = []
    for name, groups, size, dtype, has_w, has_z in _AOT_PROBLEMS:
        x = torch.randn(64, groups * size, dtype=dtype, requires_grad=True)
        w = torch.ones(groups * size, requires_grad=True) if has_w else None
        z = torch.randn(64, groups * size, dtype=dtype, requires_grad=True) if has_z else None
        with recording() as rec:
            rms_norm_triton(x, w, z, 1e-5, size).float().sum().backward()
        for kernel, _grid, args, meta in rec:
            out.append(KernelLaunch(name=f"{kernel.fn.__name__}-{name}", kernel=kernel, args=tuple(args),
                                    meta=dict(meta)))
    return out


def describe(spec: DeviceSpec) -> list[dict]:
    return [{"kernel": "rms_norm", "config": asdict(choose_config(groups, size)),
             "problem": {"groups": groups, "group_size": size}}
            for groups, size in ((1, 32), (1, 64), (1, 128), (8, 16), (1, 4096))]
