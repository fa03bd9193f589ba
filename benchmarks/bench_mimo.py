"""MIMO Mamba-3 Triton kernels: forward and forward+backward time, per-kernel CUDA time, cold compile time.

Shapes (issue 4): bf16, H=32, G=1, N=128, P=64, R=4, chunk 16, with D and Z (and mimo_out):
B=8, T=4096 and the same tokens as one sequence, B=1, T=32768; then B=8, T=4096 at the other P buckets (16, 32,
128: each has its own configuration), without the per-kernel breakdown.

    PYTHONPATH=. python3 benchmarks/bench_mimo.py --out benchmarks/results/mimo_h200.json

Writes JSON and markdown (same path with .md). Targets (H200): forward ≤ 2.1 ms, forward+backward ≤ 8.4 ms,
first forward+backward (cold compile) ≤ 60 s.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

# Cold compile means an empty Triton cache: use a fresh one unless the caller set one.
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="mamba3-bench-mimo-"))

import torch  # noqa: E402


def make_args(bsz, seqlen, nheads=32, ngroups=1, dstate=128, headdim=64, rank=4, dtype=torch.bfloat16):
    from mamba3.testing.inputs import mimo_inputs

    args = mimo_inputs(bsz=bsz, seqlen=seqlen, nheads=nheads, ngroups=ngroups, dstate=dstate, headdim=headdim,
                       rank=rank, nangles=dstate // 4, dtype=dtype, device="cuda", with_D=True, with_z=True)
    return args


def sweep_variants(spec):
    """The --sweep variants as (configuration, input dtype, headdim) for a DeviceSpec (the P = 64 configuration's
    variants first, then the other P buckets')."""
    import dataclasses

    from mamba3.ops.mimo.configs import MimoProblem, choose_config

    R = dataclasses.replace
    chosen = choose_config(spec, MimoProblem(128, 64, 4))
    base = R(chosen, scan_fwd=False)  # the chunked forward (the dispatcher runs the scan on filling grids)
    variants = [R(base, state_tiles=st, name=f"{base.name}-st{st}") for st in (1, 2, 4)]
    # the twelfth session's warp counts: each kernel family back at 8 warps (one CTA per SM)
    variants += [R(base, warps=8, name=f"{base.name}-out8"), R(base, state_warps=8, name=f"{base.name}-state8"),
                 R(base, warps_bwd=8, name=f"{base.name}-bwd8"),
                 R(base, bm_bwd=32, name=f"{base.name}-bwd32"),
                 R(base, fwd_dots16=False, name=f"{base.name}-tf32fwd"),
                 # the backward's dots tf32 (the default before the twenty-sixth session)
                 R(base, bwd_dots16=False, name=f"{base.name}-tf32bwd"),
                 # 16-bit backward dots at 32-row backward tiles and 32-column pair blocks: right on the H200
                 # (fifteenth session's GPU tests), where the 64-row dq kernel was wrong
                 R(base, bm_bwd=32, bk_bwd16=0, name=f"{base.name}-bwd32-bk32"),
                 R(base, save_y=True, name=f"{base.name}-savey"),  # B1 T32768: 33.22 → 28.90 ms
                 # y in bf16: B1 T32768 30.00 → 30.85 ms (H100, 41st session)
                 R(base, save_y=True, save_y16=True, name=f"{base.name}-savey16"),
                 # the dq / dk kernels forming the weighted dP again (bwd_store_dpw off: B1 T32768 34.10 against
                 # 33.43 ms, H100, 41st session), at two tiles per state chunk and at one
                 R(base, bwd_store_dpw=False, name=f"{base.name}-nodpw"),
                 R(base, bwd_store_dpw=False, state_tiles=1, name=f"{base.name}-st1-nodpw"),
                 # the stored blocks in fp32 (dpw16 off: twice their 1.07 GB here; B1 T32768 33.47 against 32.79
                 # ms, H100, 42nd session)
                 R(base, dpw16=False, name=f"{base.name}-dpw32"),
                 # the backward's state copies (S entering, dS at the end of each chunk) in fp32 (bwd_states16 off)
                 R(base, bwd_states16=False, name=f"{base.name}-states32"),
                 # the forward's output kernel at ptxas's 189 registers (fwd_out_maxnreg off; at 168, three CTAs per
                 # SM: 31.47 → 30.91 ms, H100, 56th session)
                 R(base, fwd_out_maxnreg=0, name=f"{base.name}-outreg0"),
                 # the chunk states at 168 registers (state_maxnreg: three CTAs per SM for 440 / 344 B of spills per
                 # thread, AOT sm_90 bf16; where the other buckets' won, their spills were ≤ 64 B): B1 T32768 31.03
                 # against 32.82 ms, the kernel 4.78 → 6.55 (H100, 57th session)
                 R(base, state_maxnreg=168, name=f"{base.name}-statereg168"),
                 # the dq / dk kernels on 64-column blocks at 8 warps on sm_90 (bk_dqk90, warps_dqk90: one block per
                 # (tile, head) instead of two at 4 warps, the same instructions per tile and head, AOT sm_90 bf16)
                 R(base, bk_dqk90=64, warps_dqk90=8, name=f"{base.name}-dqk64w8")]
    # the scan forward (one walk per sequence, head and P block; the state in registers), forced, with the
    # backward's state passes as scans (scan_variant: scan_states and scan_dstates), one of them, or neither
    scan = chosen.scan_variant()
    variants += [scan, R(scan, scan_dstates=False, name=f"{scan.name}-states"),
                 R(scan, scan_states=False, name=f"{scan.name}-dstates"),
                 R(scan, scan_states=False, scan_dstates=False, name=f"{scan.name}-chunked-passes"),
                 R(scan, bwd_dots16=False, name=f"{scan.name}-tf32bwd"),
                 # the dq / dk kernels on 16-bit dots too (bwd16_dqk: 30.47 against 30.03 ms, 28th session,
                 # before bwd_store_dpw; with it the stored dP is 16-bit too)
                 R(scan, bwd16_dqk=True, name=f"{scan.name}-dqk16"),
                 # the scan's operands broadcast per token / rank (scan_gather off: 30.47 against 29.53 ms)
                 R(scan, scan_gather=False, name=f"{scan.name}-bcast"),
                 # y kept from the forward for the epilogue's backward (save_y: 29.07 → 25.15 ms, 39th session,
                 # for 1.07 GB more memory here)
                 R(scan, save_y=True, name=f"{scan.name}-savey"),
                 # y kept in bf16 (save_y16: half of save_y's memory; 25.13 → 25.51 ms, H100, 41st session)
                 R(scan, save_y=True, save_y16=True, name=f"{scan.name}-savey16"),
                 # the dq / dk kernels forming the weighted dP again instead of loading the dv kernel's
                 # (bwd_store_dpw off: 28.96 against 29.44 ms, H100, 40th session)
                 R(scan, bwd_store_dpw=False, name=f"{scan.name}-nodpw"),
                 R(scan, bwd_store_dpw=False, save_y=True, name=f"{scan.name}-savey-nodpw"),
                 # the stored blocks in fp32 (dpw16 off: 1.07 GB instead of 0.54 here; 28.81 against 28.35 ms,
                 # with save_y 25.16 against 24.71, H100, 42nd session)
                 R(scan, dpw16=False, name=f"{scan.name}-dpw32"),
                 R(scan, dpw16=False, save_y=True, name=f"{scan.name}-savey-dpw32"),
                 # the backward's state copies (S entering, dS at the end of each chunk) in fp32 (bwd_states16 off;
                 # on: 26.96 → 25.23 ms, H100, 55th session)
                 R(scan, bwd_states16=False, name=f"{scan.name}-states32"),
                 R(scan, bwd_states16=False, save_y=True, name=f"{scan.name}-savey-states32"),
                 # the walks at 8 warps (one CTA per SM, so B8's 256 programs in two waves; 4 warps: forward 4.83 →
                 # 3.93 ms, H100, 55th session)
                 R(scan, scan_warps=8, name=f"{scan.name}-walk8"),
                 R(scan, scan_warps=8, bwd_states16=False, name=f"{scan.name}-walk8-states32"),
                 # the output kernel's backward forming y again instead of the backward's states-only walk
                 # (bwd_walk_y off: 25.37 against 24.54 ms, H100, 55th session)
                 R(scan, bwd_walk_y=False, name=f"{scan.name}-ycalc"),
                 # that walk's y in bf16 (save_y16 without save_y: half the buffer's 1.07 GB; 24.40 against
                 # 24.83 ms, the output kernel's backward 1.41 → 2.10, H100, 56th session)
                 R(scan, save_y16=True, name=f"{scan.name}-walky16"),
                 R(scan, bk_dqk90=64, warps_dqk90=8, name=f"{scan.name}-dqk64w8"),  # as -dqk64w8 above
                 # the reverse state walk on 32-column N-pair blocks (twice the walks) at 128 registers (four CTAs
                 # per SM: 512 walks in one wave, 272 B of spills per thread) or 168 (three: 84 B, two waves; AOT
                 # sm_90 bf16)
                 R(scan, dstates_bk=32, dstates_maxnreg=128, name=f"{scan.name}-dsb32r128"),
                 R(scan, dstates_bk=32, dstates_maxnreg=168, name=f"{scan.name}-dsb32r168")]
    # fp32 inputs (tf32x3 dots) on the configuration's 64-row tiles (bm_fp32 off), which spill ≈ 4 KB per thread
    # in the output kernel (AOT sm_90) where the 32-row ones (bm_fp32 = 32) spill 680 B: B8 T4096 99.31 against
    # 86.37 ms (H100, 42nd session)
    # (-fp32bwd64: the dq / dk / dv kernels on 64 rows, bm_bwd_fp32, after the 32-row forward; not timed yet. On 16
    # rows: 86.40 against 100.52 ms, H100, 43rd session, though AOT sm_90 spills per thread dq / dk / dv are 752 / 72
    # / 760 B at 32 rows and none at 16)
    fp32_rows64 = R(base, bm_fp32=0, name=f"{base.name}-fp32bm64")
    variants = [(v, torch.bfloat16, 64) for v in variants] + [(v, torch.float32, 64) for v in (
        base, R(base, bwd_store_dpw=False, name=f"{base.name}-nodpw"),
        R(base, bm_bwd_fp32=64, name=f"{base.name}-fp32bwd64"),
        fp32_rows64, R(fp32_rows64, bwd_store_dpw=False, name=f"{fp32_rows64.name}-nodpw"))]
    # the other P buckets' configurations (named -P<headdim>) as the dispatcher picks them, without the stored
    # weighted dP (bwd_store_dpw: on in every bucket since the 42nd session, e.g. P = 128 fp32 280.1 → 228.9 ms,
    # H100), with it in fp32 for 16-bit inputs (dpw16 off: bf16 blocks on since the 43rd session, e.g. P = 32 28.76
    # → 27.62 ms) and, for fp32 inputs, on the other tile rows: 32-row tiles where the bucket keeps 64 (bm_fp32; P =
    # 32: 50.63 → 70.41 ms, off), 64-row tiles or a 32-row backward where it runs 32 / 16 (P = 128: 228.12 / 217.07
    # against 141.97 ms; H100, 43rd session)
    for p in (16, 32, 128):
        cfg = choose_config(spec, MimoProblem(128, p, 4))
        named = lambda tag, **flags: R(cfg, **flags, name=f"{cfg.name}{tag}-P{p}")  # noqa: E731
        variants += [(c, dtype, p) for dtype in (torch.bfloat16, torch.float32)
                     for c in (named(""), named("-nodpw", bwd_store_dpw=False))]
        variants.append((named("-dpw32", dpw16=False), torch.bfloat16, p))
        variants.append((named("-states32", bwd_states16=False), torch.bfloat16, p))  # fp32 state copies
        # the dq / dk kernels on one 64-column block at 8 warps on sm_90 (AOT sm_90 bf16, SASS of the head loop per
        # tile and head: P = 128 33,760 → 23,608 warp instructions; P = 16 / 32 about the same)
        variants.append((named("-dqk64w8", bk_dqk90=64, warps_dqk90=8), torch.bfloat16, p))
        # the register caps (MimoConfig.fwd_out_maxnreg "out", bwd_out_maxnreg "bout", state_maxnreg "state"):
        # each candidate added where the bucket runs without it (-<tag>reg<cap>), removed where it runs with it
        # (-<tag>reg0). H100, B8 T4096, forward+backward ms without → with (56th / 57th sessions): P = 16 out 128
        # 23.96 → 23.53, bout 168 → 22.98, state 96 → 23.96 (not set); P = 32 out 168 26.94 → 26.35, bout 168 26.43
        # → 25.81, state 168 → 25.88; P = 128 out 168 77.71 → 78.40 (not set; 512 B of spills), state 168 → 75.45
        caps = {16: dict(out=128, bout=168, state=96), 32: dict(out=168, bout=168, state=168),
                128: dict(out=168, state=168)}[p]
        fields = dict(out="fwd_out_maxnreg", bout="bwd_out_maxnreg", state="state_maxnreg")
        for tag, cap in caps.items():
            on = getattr(cfg, fields[tag])
            variants.append((named(f"-{tag}reg{0 if on else cap}", **{fields[tag]: 0 if on else cap}),
                             torch.bfloat16, p))
        if cfg.bm_fp32:
            variants += [(named("-fp32bm64", bm_fp32=0, bm_bwd_fp32=0), torch.float32, p),
                         (named("-fp32bwd32", bm_bwd_fp32=0), torch.float32, p)]
        elif cfg.bm > 32:
            variants.append((named("-fp32bm32", bm_fp32=32), torch.float32, p))
    return variants


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/mimo.json", help="JSON path; a .md table is written beside it")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--sweep", action="store_true",
                    help="also time variants of the P = 64 configuration (state chunk length, warps per kernel family, "
                         "backward tile, tf32 forward dots, the scan forward; the other P buckets' configurations "
                         "with bwd_store_dpw on and off, named -P<headdim>) at B=8, T=4096 (see --sweep-batch)")
    ap.add_argument("--only", default="", help="with --sweep: comma-separated substrings of the variants to time "
                                               "(matched against 'config/dtype', e.g. 'st1,fp32bm32/float32')")
    ap.add_argument("--shapes", default="all", choices=("all", "issue", "none"),
                    help="'all' (default), or 'issue' for the B=8 T=4096 bf16 P=64 row alone, or 'none' (with --sweep: "
                         "only the variants, for a short device call)")
    ap.add_argument("--sweep-batch", type=int, default=8, choices=(1, 2, 4, 8),
                    help="with --sweep: the batch of the variants' shape, at T = 32768 / batch (the scan forward's "
                         "parallelism is batch × heads, so B=1 is where it would lose)")
    ap.add_argument("--sweep-kernels", action="store_true",
                    help="with --sweep: also record each variant's per-kernel CUDA time of one forward+backward")
    ap.add_argument("--profile", action="store_true",
                    help="only run the B=8 T=4096 bf16 forward+backward of the chosen configuration three times (no "
                         "timing, no results): for a profiler (scripts/profile_kernels.sh)")
    ns = ap.parse_args()
    if ns.profile:
        from mamba3.ops.mimo.check import call
        from mamba3.ops.mimo.function import mimo_triton
        from mamba3.testing.inputs import tensor_leaves

        args = make_args(8, 4096)
        leaves = [x.requires_grad_(True) for _, x in tensor_leaves(args)]
        dout = torch.randn(8, 4096, 32, 64, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            out = call(mimo_triton, args, chunk_size=16, precision="ieee")[0]
            torch.autograd.grad(out, leaves, dout, allow_unused=True)
        torch.cuda.synchronize()
        return

    from benchmarks.common import bench_ms, kernel_breakdown, write_results
    from mamba3.dispatch import device_spec
    from mamba3.ops.mimo.check import call
    from mamba3.ops.mimo.configs import MimoProblem, choose_config
    from mamba3.ops.mimo.function import mimo_triton
    from mamba3.testing.inputs import tensor_leaves

    rep = 20 if ns.quick else 100
    rows = []
    kernels = {}  # per-kernel CUDA time of one forward+backward, per shape
    cold = None
    bf16, fp32 = torch.bfloat16, torch.float32
    shapes = ((8, 4096, 64, bf16), (1, 32768, 64, bf16), (8, 4096, 16, bf16), (8, 4096, 32, bf16),
              (8, 4096, 128, bf16), (8, 4096, 64, fp32))
    shapes = {"all": shapes, "issue": shapes[:1], "none": ()}[ns.shapes]
    for bsz, seqlen, headdim, dtype in shapes:
        issue_shape = headdim == 64 and dtype == bf16
        args = make_args(bsz, seqlen, headdim=headdim, dtype=dtype)
        leaves = [x for _, x in tensor_leaves(args)]

        def fwd():
            return call(mimo_triton, args, chunk_size=16, precision="ieee")[0]

        for x in leaves:
            x.requires_grad_(True)
        dout = torch.randn(bsz, seqlen, 32, headdim, device="cuda", dtype=dtype)

        def fwd_bwd():
            o = fwd()
            torch.autograd.grad(o, leaves, dout, allow_unused=True)

        if cold is None:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fwd_bwd()
            torch.cuda.synchronize()
            cold = time.perf_counter() - t0
        with torch.no_grad():
            t_fwd = bench_ms(fwd, rep=rep)
        t_fb = bench_ms(fwd_bwd, rep=rep)
        config = choose_config(device_spec(), MimoProblem(128, headdim, 4, dtype)).name
        rows.append({"B": bsz, "T": seqlen, "H": 32, "N": 128, "P": headdim, "R": 4,
                     "dtype": str(dtype).removeprefix("torch."),
                     "config": config, "fwd_ms": t_fwd, "fwd_bwd_ms": t_fb,
                     "target_fwd_ms": 2.1 if issue_shape else "—", "target_fwd_bwd_ms": 8.4 if issue_shape else "—"})
        print(rows[-1], flush=True)
        if issue_shape:
            kernels[f"B{bsz}-T{seqlen}"] = kernel_breakdown(fwd_bwd, leaves)
            print(kernels[f"B{bsz}-T{seqlen}"], flush=True)
        del args, leaves, dout
        torch.cuda.empty_cache()
    sweep = []
    if ns.sweep:
        from mamba3.ops.mimo.check import compare as compare_with_float64
        from mamba3.testing.inputs import mimo_inputs

        variants = sweep_variants(device_spec())
        # a miscompiled variant shows here first: its errors against float64 on a small case (bf16 and fp32)
        small = {(dt, p): mimo_inputs(bsz=2, seqlen=100, nheads=4, ngroups=1, dstate=128, headdim=p, rank=4,
                                      nangles=32, dtype=dt, device="cuda", with_D=True, with_z=True)
                 for dt in (torch.bfloat16, torch.float32) for p in (16, 32, 64, 128)}
        keep = [x for x in ns.only.split(",") if x]
        for cfg, dtype, headdim in variants:
            if keep and not any(x in f"{cfg.name}/{str(dtype).removeprefix('torch.')}" for x in keep):
                continue
            sb, st = ns.sweep_batch, 32768 // ns.sweep_batch
            args = make_args(sb, st, headdim=headdim, dtype=dtype)
            leaves = [x for _, x in tensor_leaves(args)]
            for x in leaves:
                x.requires_grad_(True)
            dout = torch.randn(sb, st, 32, headdim, device="cuda", dtype=dtype)

            def fwd(cfg=cfg, args=args):
                return call(mimo_triton, args, chunk_size=16, precision="ieee", config=cfg)[0]

            def fwd_bwd(cfg=cfg, args=args, leaves=leaves, dout=dout):
                torch.autograd.grad(fwd(cfg, args), leaves, dout, allow_unused=True)

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            held = torch.cuda.memory_allocated()  # the inputs, dout and the float64 check's small cases
            fwd_bwd()
            peak_gb = (torch.cuda.max_memory_allocated() - held) / 1e9  # what forward+backward adds at its peak
            with torch.no_grad():
                t_fwd = bench_ms(fwd, rep=rep)
            worst = {str(dt).removeprefix("torch."): max(compare_with_float64(a, config=cfg).items(),
                                                         key=lambda kv: kv[1])
                     for (dt, p), a in small.items() if p == headdim}
            sweep.append({"config": cfg.name, "dtype": str(dtype).removeprefix("torch."), "P": headdim,
                          "batch": sb, "seqlen": st,
                          "fwd_ms": t_fwd,
                          "fwd_bwd_ms": bench_ms(fwd_bwd, rep=rep), "peak_gb": round(peak_gb, 3),
                          "worst_rel_err": {k: f"{n} {e:.2e}" for k, (n, e) in worst.items()}})
            if ns.sweep_kernels:
                sweep[-1]["kernels_fwd_bwd_ms"] = kernel_breakdown(fwd_bwd, leaves)
            print(sweep[-1], flush=True)
            del args, leaves, dout
            torch.cuda.empty_cache()
    write_results(ns.out, "MIMO Mamba-3 Triton kernels", rows,
                  extra={"cold_fwd_bwd_s": cold, "kernels_fwd_bwd_ms": kernels, **({"sweep": sweep} if sweep else {})})
    print({"cold_fwd_bwd_s": cold})


if __name__ == "__main__":
    main()
