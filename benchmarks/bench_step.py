"""Decode-step benchmark (one token, states updated in place), CUDA-graph timed.

Default problem (issue 5): batch 128, H = 64, N = 128, P = 64, bf16 inputs, fp32 states; SISO and MIMO R = 4.
Reports the time per step, the bytes the step must move (states read + written, inputs, output), the achieved
bandwidth and its fraction of the device-to-device copy bandwidth measured in the same run, for the config the
dispatcher chooses and for a small sweep of alternatives (so a better tile can be adopted from the data). For
the chosen config also the time of the state's in-place read + write alone (torch ``mul_`` and a Triton kernel
with the same tiles): the step's floor for this access pattern.

    python3 benchmarks/bench_step.py --out results/step.json
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ceilings, write_results  # noqa: E402
from mamba3.ops.step.configs import StepConfig, StepProblem, choose_config  # noqa: E402
from mamba3.ops.step.launch import step_triton  # noqa: E402


def make(bsz, H, G, P, N, R, siso, dtype, dev="cuda"):
    A = N // 4
    f32 = torch.float32
    x = dict(q=torch.randn(bsz, R, G, N, device=dev, dtype=dtype), k=torch.randn(bsz, R, G, N, device=dev, dtype=dtype),
             v=torch.randn(bsz, H, P, device=dev, dtype=dtype), adt=-torch.rand(bsz, H, device=dev) * 0.1,
             dt=torch.rand(bsz, H, device=dev) * 0.1, trap=torch.randn(bsz, H, device=dev),
             q_bias=torch.ones(H, R, N, device=dev), k_bias=torch.ones(H, R, N, device=dev),
             mimo_v=None if siso else torch.ones(H, R, P, device=dev) / R,
             mimo_z=None if siso else torch.ones(H, R, P, device=dev),
             mimo_out=None if siso else torch.ones(H, R, P, device=dev) / R,
             angles=torch.randn(bsz, A, device=dev), D=torch.ones(H, device=dev),
             z=torch.randn(bsz, H, P, device=dev, dtype=dtype),
             angle_state=torch.zeros(bsz, H, A, device=dev), ssm_state=torch.zeros(bsz, H, P, N, device=dev),
             k_state=torch.zeros(bsz, R, H, N, device=dev, dtype=f32),
             v_state=torch.zeros(bsz, H, P, device=dev, dtype=dtype), state_batch_indices=None, rms_norm=False,
             norm_weight=None, norm_eps=1e-5)
    return x


ORDER = ["q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "mimo_v", "mimo_z", "mimo_out", "angles", "D",
         "z", "angle_state", "ssm_state", "k_state", "v_state", "state_batch_indices", "rms_norm", "norm_weight",
         "norm_eps"]


def errors_against_float64(x, siso, cfg):
    """One step of ``cfg`` from random states against the float64 reference on the same inputs: relative
    Frobenius error of the output (bf16, so ≈ 1e-3 is its rounding) and of the new fp32 state (a miscompiled
    tile shows as O(1))."""
    from mamba3.ops.step.reference import step_reference
    from mamba3.testing.errors import rel_frobenius

    dev = x["v"].device
    g = torch.Generator(device=dev).manual_seed(0)
    y = dict(x)
    for n in ("angle_state", "ssm_state", "k_state", "v_state"):
        y[n] = torch.randn(x[n].shape, generator=g, device=dev).to(x[n].dtype)
    y["angle_state"] = y["angle_state"].abs().remainder(2 * math.pi)
    # float64 copies (the reference updates its own states in place)
    ref = {n: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for n, t in y.items()}
    out = step_triton(*[y[n] for n in ORDER], siso=siso, config=cfg)
    ref_out = step_reference(*[ref[n] for n in ORDER], pairing="adjacent" if siso else "half", siso=siso)
    return {"err_out": rel_frobenius(out, ref_out), "err_state": rel_frobenius(y["ssm_state"], ref["ssm_state"])}


def bytes_moved(x):
    """Bytes a step must read and write: states twice (read + write), every other tensor once."""
    total = 0
    for n in ORDER:
        t = x[n]
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size() * (2 if n.endswith("_state") else 1)
    out = x["v"]
    return total + out.numel() * out.element_size()


@triton.jit
def _scale_state_kernel(s_ptr, alpha, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Diagnostic: S ← α·S in place with the step kernel's tiling and cache hints (one BLOCK_P × BLOCK_N tile per
    program), i.e. the state traffic of a step without any of its other loads or arithmetic."""
    base = tl.program_id(0).to(tl.int64) * BLOCK_P * BLOCK_N
    offs = base + tl.arange(0, BLOCK_P)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    x = tl.load(s_ptr + offs, eviction_policy="evict_first")
    tl.store(s_ptr + offs, x * alpha, eviction_policy="evict_first")


def state_stream_ceilings(state: torch.Tensor, cfg: StepConfig) -> dict:
    """Time to read and write the (B, H, P, N) fp32 state in place, without the step's other work: PyTorch's
    in-place multiply, and the same traffic in the step kernel's tiles (CUDA-graph timed, ms)."""
    import triton.testing

    n = state.numel()
    tile = cfg.block_p * cfg.block_n
    if n % tile or state.shape[-1] != cfg.block_n:
        return {}
    torch_ms = triton.testing.do_bench_cudagraph(lambda: state.mul_(0.999), rep=200, return_mode="median")
    tiles_ms = triton.testing.do_bench_cudagraph(
        lambda: _scale_state_kernel[(n // tile,)](state, 0.999, BLOCK_P=cfg.block_p, BLOCK_N=cfg.block_n,
                                                  num_warps=cfg.num_warps), rep=200, return_mode="median")
    return {"state_inplace_torch_ms": float(torch_ms), "state_inplace_tiles_ms": float(tiles_ms)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="results JSON (the markdown table beside it)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--nheads", type=int, default=64)
    ap.add_argument("--dstate", type=int, default=128)
    ap.add_argument("--headdim", type=int, default=64)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--profile", choices=("siso", "mimo"),
                    help="only run the chosen step of this op five times (no timing, no results): for a profiler "
                         "(scripts/profile_kernels.sh)")
    args = ap.parse_args()
    if not (args.out or args.profile):
        ap.error("--out is required (except with --profile)")
    if args.profile:
        siso = args.profile == "siso"
        R = 1 if siso else 4
        x = make(args.batch, args.nheads, 1, args.headdim, args.dstate, R, siso, torch.bfloat16)
        cfg = choose_config(None, StepProblem(args.headdim, args.dstate, R, row_heads=args.batch * args.nheads))
        for _ in range(5):
            step_triton(*[x[n] for n in ORDER], siso=siso, config=cfg)
        torch.cuda.synchronize()
        return
    import triton.testing

    ceil = ceilings()
    copy_bw = ceil["copy_TBps"]
    rows = []
    siso_ms = None
    for mode, R in (("siso", 1), ("mimo", 4)):
        siso = mode == "siso"
        x = make(args.batch, args.nheads, 1, args.headdim, args.dstate, R, siso, torch.bfloat16)
        nbytes = bytes_moved(x)
        chosen = choose_config(None, StepProblem(args.headdim, args.dstate, R, row_heads=args.batch * args.nheads))
        configs = [chosen]
        if not args.no_sweep:
            full_n = 1 << (args.dstate - 1).bit_length()
            full_p = 1 << (args.headdim - 1).bit_length()
            # whole rows per tile, each program streaming row_tiles tiles (all of P: one launch)
            for bp, w in ((4, 1), (8, 1), (16, 1), (16, 2), (32, 2)):
                for rt in (1, 2, 4, 8, 16):
                    c = StepConfig(block_p=bp, block_n=full_n, num_warps=w, row_tiles=rt,
                                   rows_warps=chosen.rows_warps)
                    if bp * rt <= full_p and c not in configs:
                        configs.append(c)
            # N in several tiles (the next one prefetched): fewer registers per program, more programs resident
            for bp, bn in ((8, 32), (8, 64), (16, 64)):
                c = StepConfig(block_p=bp, block_n=bn, num_warps=1, rows_warps=chosen.rows_warps)
                if bn < full_n and c not in configs:
                    configs.append(c)
        for cfg in configs:
            fn = lambda: step_triton(*[x[n] for n in ORDER], siso=siso, config=cfg)
            fn()
            torch.cuda.synchronize()
            ms = float(triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median"))
            tbps = nbytes / ms / 1e9
            row = dict(op=mode, rank=R, batch=args.batch, nheads=args.nheads, headdim=args.headdim,
                       dstate=args.dstate, block_p=cfg.block_p, block_n=cfg.block_n, num_warps=cfg.num_warps,
                       row_tiles=cfg.row_tiles, lane_sums=cfg.lane_sums,
                       chosen=cfg == chosen, ms=ms, MB=nbytes / 1e6, TBps=tbps, frac_of_copy=tbps / copy_bw,
                       **errors_against_float64(x, siso, cfg))
            if cfg == chosen and siso:
                siso_ms = ms
            if not siso and siso_ms:  # every MIMO row against the chosen SISO step
                row["vs_siso"] = ms / siso_ms
            if cfg == chosen:
                row.update(state_stream_ceilings(x["ssm_state"], cfg))
            rows.append(row)
            print(row, flush=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[-1]).index(k) if k in rows[-1] else 99)
    rows = [{k: r.get(k, "") for k in keys} for r in rows]
    targets = {"siso_ms_target": 0.14, "official_siso_ms": 0.156, "mimo_over_siso_target": 1.2}
    write_results(args.out, "Mamba-3 decode step (bf16 inputs, fp32 states, CUDA graph)", rows,
                  extra={**ceil, **targets})


if __name__ == "__main__":
    main()
