"""Configurations of the decode-step kernel, the dispatcher's choice, and the launches the AOT lane compiles.

The step is pure bandwidth: per (batch row, head) it reads and writes the fp32 (P × N) state once and
everything else is tiny. One program owns one (row, head) (see kernel.py for why P is not split), and streams
its state in tiles of all P rows × BLOCK_N columns. The tile is sized to ~8K fp32 values (32 KiB in
registers: 32 per thread at 8 warps), large enough that each program keeps many 16-byte loads in flight and
small enough not to spill; the warp count keeps ~32 values per thread for smaller tiles. Nothing is staged
through shared memory on purpose (only the small reductions of y = h'q̃ and the RMSNorm use it), so the
kernel fits every architecture's budget with room to spare, and num_stages stays 1 (the N loop has at most
a few iterations; there is nothing to pipeline).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

TILE_ELEMS = 8192          # fp32 state values per tile (all P rows × BLOCK_N columns)


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass(frozen=True)
class StepConfig:
    block_n: int           # state columns per tile (power of two)
    num_warps: int         # 1..8: about 32 tile values per thread
    num_stages: int = 1    # nothing to pipeline


@dataclass(frozen=True)
class StepProblem:
    headdim: int           # P
    dstate: int            # N
    rank: int = 1          # R (1 = SISO)


def choose_config(spec, problem: StepProblem) -> StepConfig:
    """The tile for a problem (the same on every architecture: registers only, a few KiB of shared memory)."""
    if not 1 <= problem.headdim <= 256:
        raise ValueError(f"step kernel: headdim P={problem.headdim} is outside 1..256 (the whole P column of the "
                         "state is one register tile)")
    if problem.dstate < 2 or problem.dstate % 2:
        raise ValueError(f"step kernel: d_state N={problem.dstate} must be even and ≥ 2")
    block_p = next_pow2(problem.headdim)
    # MIMO keeps R rotated k̃/q̃ rows and the rank loop live next to the tile: halve the tile (AOT: the full
    # 8K tile at R = 4 hits the 128-register cap of 8 warps on sm_90 and spills)
    tile = TILE_ELEMS if problem.rank == 1 else TILE_ELEMS // 2
    block_n = min(next_pow2(problem.dstate), max(16, tile // block_p))
    num_warps = max(1, min(8, block_p * block_n // (1024 if problem.rank == 1 else 512)))
    return StepConfig(block_n=block_n, num_warps=num_warps)


# Representative problems compiled by the AOT lane: every tile shape the chooser produces for the supported
# head dims (16..128) and state sizes (16..256), SISO and MIMO, bf16 and fp32 inputs, each output mode.
_AOT_PROBLEMS = [
    # (name, P, N, R, input dtype, mode)
    ("siso_p64_n128_bf16", 64, 128, 1, torch.bfloat16, "siso"),
    ("siso_p16_n16_fp32", 16, 16, 1, torch.float32, "siso"),
    ("siso_p128_n256_fp32", 128, 256, 1, torch.float32, "siso"),
    ("siso_p32_n64_fp16", 32, 64, 1, torch.float16, "siso"),
    ("mimo4_p64_n128_bf16", 64, 128, 4, torch.bfloat16, "mimo"),
    ("mimo4_p64_n128_bf16_rmsnorm", 64, 128, 4, torch.bfloat16, "mimo_norm"),
    ("mimo8_p128_n256_fp32", 128, 256, 8, torch.float32, "mimo"),
    ("mimo2_p32_n64_bf16_per_rank", 32, 64, 2, torch.bfloat16, "mimo_per_rank"),
]


def _example(P, N, R, dtype, mode, bsz=4, nheads=8):
    """CPU tensors shaped like a real call (dtype and alignment are what matter for compilation)."""
    from .launch import build_launch

    siso = mode == "siso"
    A = N // 4
    f32 = torch.float32
    q = torch.empty(bsz, R, 1, N, dtype=dtype)
    k = torch.empty(bsz, R, 1, N, dtype=dtype)
    v = torch.empty(bsz, nheads, P, dtype=dtype)
    z = torch.empty(bsz, nheads, P, dtype=dtype)
    adt, dt, trap = (torch.empty(bsz, nheads, dtype=f32) for _ in range(3))
    angles = torch.empty(bsz, A, dtype=f32)
    qb = torch.empty(nheads, R, N, dtype=f32)
    kb = torch.empty(nheads, R, N, dtype=f32)
    D = torch.empty(nheads, dtype=f32)
    mimo = None if siso else torch.empty(nheads, R, P, dtype=f32)
    states = (torch.empty(bsz, nheads, A, dtype=f32), torch.empty(bsz, nheads, P, N, dtype=f32),
              torch.empty(bsz, R, nheads, N, dtype=f32), torch.empty(bsz, nheads, P, dtype=dtype))
    norm = mode == "mimo_norm"
    return build_launch(q, k, v, adt, dt, trap, qb, kb, mimo, mimo, None if mode == "mimo_per_rank" else mimo,
                        angles, D, z, *states, None, norm, torch.empty(nheads, P, dtype=f32) if norm else None,
                        1e-5, siso=siso, config=choose_config(None, StepProblem(P, N, R)))


def aot_launches(arch: int):
    from ...testing.aot import KernelLaunch

    launches = []
    for name, P, N, R, dtype, mode in _AOT_PROBLEMS:
        kernel, args, meta, _grid, _out = _example(P, N, R, dtype, mode)
        launches.append(KernelLaunch(name=f"mamba3_step_kernel[{name}]", kernel=kernel, args=args, meta=meta))
    return launches


def describe(spec):
    out = []
    for name, P, N, R, dtype, mode in _AOT_PROBLEMS:
        cfg = choose_config(spec, StepProblem(P, N, R))
        out.append({"kernel": "mamba3_step_kernel", "config": asdict(cfg),
                    "problem": {"name": name, "headdim": P, "dstate": N, "rank": R, "dtype": str(dtype),
                                "mode": mode}})
    return out
