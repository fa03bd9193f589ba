"""Configurations of the decode-step kernels, the dispatcher's choice, and the launches the AOT lane compiles.

The step is pure bandwidth: per (batch row, head) it reads and writes the fp32 (P × N) state once and
everything else is tiny. The state kernel splits P over programs (see kernel.py for why that is race-free) and
streams each program's BLOCK_P rows in tiles of BLOCK_P × BLOCK_N. Small tiles in many programs are what hides
the memory latency: each resident program keeps its whole tile's loads in flight, and the more programs an SM
holds, the more of them are loading while others compute. The tile is ~2K fp32 values in as few warps as
registers allow: every warp repeats the per-column work (θ', cos/sin, the q̃/k̃ loads and rotations) for its rows, so
fewer warps per tile are cheaper (H200, bench_step.py, 16 × 128 tiles: SISO 1 / 2 / 4 / 8 warps 0.154 /
0.159 / 0.161 / 0.239 ms; MIMO R = 4: 0.279 / 0.294 / 0.475 / 0.555; MIMO 8 × 128 @ 1 warp 0.272-0.276;
after the state's row stride became a constexpr (kernel.py): SISO 16 × 128 @ 1 warp 0.1545, 8 × 128 @ 1 or 2
warps 0.1521; MIMO 8 × 128 @ 1 warp 0.2535, 16 × 128 @ 1 warp 0.262; eighth session, after MIMO's pair
blocks were rotated in registers: MIMO 8 × 128 @ 1 / 2 / 4 warps 0.2336 / 0.372 / 0.511, 16 × 128 @ 1 warp
0.2391, 32 × 128 @ 1 warp 0.2340; SISO 8 × 128 @ 1 warp 0.1524, 16 × 128 0.1551, 8 × 64 0.1540, 16 × 64
0.1664, 8 × 32 0.1923; tenth session, grids in state order and q̃/k̃ computed once per program: SISO 16 × 128 @ 2
warps 0.139, 8 × 128 0.141; MIMO one program per (row, head) streaming 8 × 128 tiles 0.171 against 0.189 for
8 programs per head — benchmarks/results/step_sweep_h200.md has the sweep).
With whole rows per tile a program may also stream several row tiles (row_tiles), computing q̃_r/k̃_r once for
all of them; holding all of P it writes the small states itself (no second launch), see kernel.py.
Nothing is staged through shared memory on purpose (only the small reductions of y = h'q̃ and the RMSNorm use it), so the kernels fit every
architecture's budget with room to spare, and num_stages stays 1 (the N loop has at most a few iterations and
prefetches its next tile by hand).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

TILE_ELEMS = 2048          # fp32 state values per program tile (BLOCK_P rows × BLOCK_N columns)


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass(frozen=True)
class StepConfig:
    block_p: int           # state rows per program (power of two); all of P when the fused RMSNorm needs it
    block_n: int           # state columns per tile (power of two)
    num_warps: int         # 1..8: about 32 tile values per thread
    num_stages: int = 1    # the N loop prefetches by hand
    row_tiles: int = 1     # BLOCK_P-row tiles a program streams (block_n ≥ N only); all of P: no rows kernel
    rows_warps: int = 1    # the small-state kernel (θ', k̃, v of one row and head)
    lane_sums: bool = False  # MIMO y_r = h'q̃_r by the lanes' reduce-scatter (kernel.py); needs lane_sums_fit


@dataclass(frozen=True)
class StepProblem:
    headdim: int           # P
    dstate: int            # N
    rank: int = 1          # R (1 = SISO)
    rms_norm: bool = False  # the fused RMSNorm over P needs all of P in one program
    row_heads: int = 0     # batch rows × heads of the call (0: unknown); enough of them → one program each


def writes_small_states(config: StepConfig, headdim: int, dstate: int) -> bool:
    """True when one program holds all of P with whole rows: it writes θ', k̃ and v itself (no rows kernel)."""
    return config.block_n >= dstate and config.block_p * config.row_tiles >= headdim


def lane_sums_fit(config: StepConfig, problem: StepProblem) -> bool:
    """Whether the kernel's lane sums apply: R = 2 or 4, 8 × 128 tiles in one warp (16 lanes per row), no RMSNorm."""
    return (problem.rank in (2, 4) and not problem.rms_norm and config.block_p == 8 and config.block_n == 128
            and config.num_warps == 1)


def choose_config(spec, problem: StepProblem) -> StepConfig:
    """The tiles for a problem (the same on every architecture: registers only, a few KiB of shared memory)."""
    if not 1 <= problem.headdim <= 256:
        raise ValueError(f"step kernel: headdim P={problem.headdim} is outside 1..256")
    if problem.dstate < 2 or problem.dstate % 2:
        raise ValueError(f"step kernel: d_state N={problem.dstate} must be even and ≥ 2")
    full_p, full_n = next_pow2(problem.headdim), next_pow2(problem.dstate)
    # Tile values per thread: 32, fewer where more per-column vectors stay live (ranks > 4) or one program holds
    # all of P (RMSNorm), else ptxas spills (AOT, sm_90: R = 8 at 16 × 64 × 4 warps 12 B; RMSNorm at 64 × 32 ×
    # 2 warps 24 B).
    row_tiles = 1
    if problem.rms_norm:
        block_p, per_thread = full_p, 16
        block_n = min(full_n, max(16, TILE_ELEMS // block_p))
    elif problem.rank > 4:
        block_p, block_n, per_thread = min(full_p, 8), min(full_n, 64), 8
    elif problem.rank > 1:              # 8 rows × 128 columns in one warp
        # MIMO's R rank vectors per column stay live beside the tile: 32 values per thread; one warp per program,
        # since each warp repeats the R loads and rotations (H200, R = 4, pair blocks: 8 × 128 @ 1 warp 0.2336 ms
        # against 0.372 @ 2 warps and 0.326 for 16 × 128 @ 2 warps)
        block_p, block_n, per_thread = min(full_p, 8), min(full_n, 128), 32
        # Whole rows: one program per (row, head) streams all of P, computing q̃_r/k̃_r once instead of once per
        # 8 rows, and writes the small states itself (H200, tenth session, batch 128: 0.171 ms against 0.191 for
        # 8 programs per head) — when there are enough (row, head) pairs to fill the GPU (≥ 1024: an H200's 132
        # SMs hold ≈ 8 of these 250-register programs each); small batches keep 8 programs per head
        if block_n >= problem.dstate and problem.row_heads >= 1024:
            row_tiles = full_p // block_p
    else:                               # 16 rows × 128 columns (512-byte rows) in two warps: 4 programs per head at P = 64
        # (H200, bench_step.py, batch 128, tenth session with the grids in state order, two runs: 0.1392 / 0.1388 ms
        # against 0.1414 / 0.1411 for 8 × 128 @ 1 warp, 0.1403 / 0.1399 for 4 × 128, 0.1446 / 0.1449 for one program
        # per (row, head); before the grid order was fixed 8 × 128 @ 1 warp led, 0.152 against 0.156 for 16 × 128)
        block_p, block_n, per_thread = min(full_p, 16), min(full_n, 128), 32
    num_warps = max(1, min(8, block_p * block_n // (32 * per_thread)))
    rows_warps = max(1, min(4, problem.rank * full_n // 256))
    config = StepConfig(block_p=block_p, block_n=block_n, num_warps=num_warps, rows_warps=rows_warps,
                        row_tiles=row_tiles)
    # The cross-lane sums of y_r as one reduce-scatter where they apply: AOT sm_90, R = 4, 8 × 128 tiles, the
    # streaming loop 868 → 732 instructions per tile (shuffles 66 → 18), 252 → 238 registers; H200, batch 128,
    # P = 64, N = 128 (bench_step.py, twentieth session, one run): 0.1717 → 0.1673 ms
    return replace(config, lane_sums=lane_sums_fit(config, problem))


# Representative problems compiled by the AOT lane: every tile shape the chooser produces for the supported
# head dims (16..128) and state sizes (16..256), SISO and MIMO, bf16 and fp32 inputs, each output mode.
_AOT_PROBLEMS = [
    # (name, P, N, R, input dtype, mode, batch rows × heads)
    ("siso_p64_n128_bf16", 64, 128, 1, torch.bfloat16, "siso", 32),
    ("siso_p16_n16_fp32", 16, 16, 1, torch.float32, "siso", 32),
    ("siso_p128_n256_fp32", 128, 256, 1, torch.float32, "siso", 32),
    ("siso_p32_n64_fp16", 32, 64, 1, torch.float16, "siso", 32),
    ("mimo4_p64_n128_bf16", 64, 128, 4, torch.bfloat16, "mimo", 32),
    ("mimo4_p64_n128_bf16_large_batch", 64, 128, 4, torch.bfloat16, "mimo", 1024),   # one program per row, head
    ("mimo4_p128_n64_fp32_large_batch", 128, 64, 4, torch.float32, "mimo", 1024),
    ("mimo4_p64_n128_bf16_rmsnorm", 64, 128, 4, torch.bfloat16, "mimo_norm", 32),
    ("mimo8_p128_n256_fp32", 128, 256, 8, torch.float32, "mimo", 32),
    ("mimo2_p32_n64_bf16_per_rank", 32, 64, 2, torch.bfloat16, "mimo_per_rank", 32),
    ("mimo2_p64_n256_fp32_per_rank", 64, 256, 2, torch.float32, "mimo_per_rank", 32),   # lane sums over N tiles
]


def _example(P, N, R, dtype, mode, row_heads, bsz=4):
    """The launches of a call with CPU tensors shaped like a real one (dtype and alignment matter to compiling)."""
    from .launch import build_launches

    nheads = row_heads // bsz
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
    launches, _out = build_launches(q, k, v, adt, dt, trap, qb, kb, mimo, mimo,
                                    None if mode == "mimo_per_rank" else mimo, angles, D, z, *states, None, norm,
                                    torch.empty(nheads, P, dtype=f32) if norm else None, 1e-5, siso=siso)
    return launches


def aot_launches(arch: int):
    from ...testing.aot import KernelLaunch

    out = []
    for name, P, N, R, dtype, mode, row_heads in _AOT_PROBLEMS:
        for kernel, args, meta, _grid in _example(P, N, R, dtype, mode, row_heads):
            out.append(KernelLaunch(name=f"{kernel.__name__}[{name}]", kernel=kernel, args=args, meta=meta))
    return out


def describe(spec):
    out = []
    for name, P, N, R, dtype, mode, row_heads in _AOT_PROBLEMS:
        cfg = choose_config(spec, StepProblem(P, N, R, rms_norm=mode == "mimo_norm", row_heads=row_heads))
        out.append({"kernel": "mamba3_step_kernel", "whole_rows": cfg.block_n >= N,
                    "rows_kernel": not writes_small_states(cfg, P, N), "config": asdict(cfg),
                    "problem": {"name": name, "headdim": P, "dstate": N, "rank": R, "dtype": str(dtype),
                                "mode": mode}})
    return out
