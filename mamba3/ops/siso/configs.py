"""SISO kernel configurations and the dispatcher's choice (no autotuning: a pure function of device and problem).

Why these tiles
---------------
* No tile grows with N or P: every per-chunk kernel loops (or grids) over N in blocks of ``bn`` dims (bn/2
  rotation pairs) and over P in blocks of ``bp``. The operands Triton stages in shared memory are C×bn, C×bp,
  bp×bn and C×C tiles, so a config's footprint depends on (chunk, bn, bp, dtype class) only (``launches.py``
  lists the AOT compiles that bound every shape).
* Two paths. 16-bit inputs with N, P ≥ 64: 16-bit tensor-core dots on 64×64 tiles with the rotation pairs
  re-interleaved into one operand, chunk 64 on every architecture (the chunk states, P·N fp32 per chunk and head,
  dominate memory traffic, so fewer, larger chunks are faster). fp32 inputs (and 16-bit inputs with N or P < 64):
  fp32 operands on tensor cores with tf32x3 dots (fp32-accurate), the pairs' even/odd halves as separate dot
  operands (``halves``), bn = 32; chunk 64 with 64-wide P blocks on sm_90, chunk 32 with 32-wide blocks elsewhere
  (see ``choose_config``). Other chunks (16, 32, 64) are accepted when the caller asks.
* warps: 4 for the chunk-state and output kernels (64×64 fp32 accumulators = 32 registers/thread at 128 threads),
  8 for the two backward kernels at chunk 64 with bp ≥ 32 and bn = 64 (or bn = 32 halves) (three C×bp / C×C
  accumulators live at once), else 4 (see ``choose_config``: Triton 3.6 miscompiles 64×16 tiles at 8 warps on
  Hopper).
* num_stages = 1 everywhere: the loops over N/P blocks are 1–4 iterations (nothing to pipeline), and Blackwell
  (sm_100/sm_120) must not pipeline (the official kernel saw num_stages > 1 corrupt outputs there).
* state_block = 256: the state-passing pass walks the chunks of a sequence sequentially; small slabs give
  NS·H·(P·N/256) programs, enough in flight to reach copy bandwidth even for B = 1 (measured 3.8 TB/s on H200).

Measured shared memory (AOT, N = P = 128, bytes incl. static; the largest kernel is bwd_dv): fp32 at chunk 64
(sm_90's default, bn = 32, bp = 64): 66,560 on sm_90 — every config fits 101,376 B with a wide margin.
``_SMEM_NEED`` holds the per-chunk worst case over the CI archs, used to refuse (with a clear message) devices that
report less.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from mamba3.dispatch import DeviceSpec

CHUNKS = (16, 32, 64)


@dataclass(frozen=True)
class SisoProblem:
    """What the choice depends on: the dtype class and the head dims (never B or T: they never recompile)."""

    dtype: str  # "fp32" | "bf16" | "fp16"
    dstate: int  # N
    headdim: int  # P
    chunk_size: int | None = None  # None: the dispatcher's choice


@dataclass(frozen=True)
class SisoConfig:
    chunk: int  # C: tokens per chunk
    bn: int  # N block (dims; bn/2 rotation pairs): bounds smem/registers independently of N
    bp: int  # P block: bounds the C×P tiles independently of P
    warps_chunk: int  # chunk_state_kernel and output_kernel
    warps_bwd: int  # bwd_dv_kernel and bwd_dqk_kernel
    stages: int  # num_stages for every kernel (1: short loops; required on Blackwell)
    state_block: int = 256  # elements of the P×N state per state-passing program (more programs in flight)
    # bwd_dqk: at most this many programs share the heads of one q/k group (each loops over its share and writes an
    # fp32 dq/dk partial, summed on the host): more programs in flight against more partial traffic
    head_split: int = 8
    # 16-bit inputs: True feeds 16-bit tensor-core dots with interleaved (re-joined) pair tiles; False runs the
    # fp32 inputs' path (fp32 dot operands, see halves and fp32_prec). See choose_config for when each is used.
    half_dots: bool = True
    # True: the rotation pairs' even/odd halves are separate dot operands (a dot over an N block is the sum of
    # two dots); False: they are re-interleaved into one C×BN operand (16-bit dots only)
    halves: bool = False
    # fp32 dot operands (fp32 inputs; 16-bit inputs without half_dots): "ieee" FMA dots or "tf32x3" tensor-core
    # dots (three tf32 products, fp32-accurate); precision="tf32" overrides it
    fp32_prec: str = "ieee"
    # True: the chunk states and their pass across chunks in one kernel (``chunk_state_scan_kernel``: a program per
    # (sequence, head, N block, P block) walks the sequence's chunks), forward and the backward's reverse pass;
    # False: chunk-parallel local states, then ``common.state_passing`` (one more fp32 state write + read, but
    # chunk-parallel: B = 1 keeps only H·(N/bn)·(P/bp) programs in the scan); None: the launcher decides from the
    # grid (``siso.function._scan_states``)
    scan_states: bool | None = None
    # True: on the 16-bit-dot path, the forward's chunk-state scan stores the state entering each chunk in the dot
    # dtype (half the bytes of the fp32 buffer: 268 instead of 537 MB written and read at B8 T4096 H32 N128 P64).
    # Bit-identical: the output kernel, its only reader, rounds each state to the dot dtype before its one dot, and
    # the scan's running state stays fp32 (as do the final state and the backward's recomputed states, which
    # bwd_dv reads in fp32). On the chunk-parallel path state_passing writes that copy from its fp32 walk (the local
    # terms keep their fp32 buffer): H100, B1 T32768 (forty-seventh session, sweep_siso.py) forward 1.714 → 1.614 ms.
    # H200, B8 T4096 (twenty-first session, sweep_siso.py, fp32 / 16-bit / fp32 states in one run): forward 1.236 /
    # 1.170 / 1.238 ms, forward+backward 6.520 / 6.429 / 6.503 (the scan kernels 1.236 → 1.182, output 0.633 → 0.624).
    states16: bool = True
    # On the 16-bit-dot path the backward's reverse state pass (here the scan) also forms the decay
    # gradient's e^{cs_L}⟨dSe, S⟩ from the recomputed fp32 states (bwd_dv's only fp32 use of them) and leaves 16-bit
    # copies of S and dS for bwd_dv and bwd_dqk, whose dots round both to the dot dtype anyway: results bit-identical
    # but for that sum's order; B8 T4096 H32 N128 P64 backward state traffic 3.22 → 2.68 GB (fp32 S written, read by
    # the scan; S16 and dS16 written once, read twice). H100, B8 T4096 bf16 (thirty-eighth session, sweep_siso.py,
    # one run each; kernels' CUDA time): bwd_dv 1.647 → 1.417 ms, bwd_dqk 2.335 → 2.245, the three scans 1.372 →
    # 1.574; forward+backward 6.809 → 6.715 alone, 6.482 → 6.394 beside bwd_store_a1. On the chunk-parallel path
    # state_passing's reverse pass does the same per slab (its fp32 dS stays in registers, the local dS in its
    # buffer): H100, B1 T32768 (forty-seventh session), forward+backward 7.482 → 7.388 ms (bwd_dv 1.617 → 1.443,
    # bwd_dqk 2.015 → 1.902, the three passes 1.189 → 1.411).
    bwd_states16: bool = True
    # On the 16-bit-dot path with one P block (P = bp), bwd_dv stores M∘(dY Vᵀ) of each chunk and head in the dot
    # dtype (it forms dY Vᵀ for the decay gradient anyway) and bwd_dqk loads it instead of a C×C×P dot and the C×C
    # decay mask per head and N block. Bit-identical (the same 16-bit operands in one dot over P in both kernels;
    # bwd_dqk rounds it to the dot dtype before its dots; checked on the H100 too); B8 T4096 H32: 134 MB more written
    # and read twice (once per N block), one of bwd_dqk's seven 64³ dots and its C×C exponentials gone. AOT sm_90 at
    # N = 128, P = 64: bwd_dqk's spill stores 488 → 252 B. H100, same run: bwd_dqk 2.335 → 2.006 ms, forward+backward
    # 6.809 → 6.482 alone, 6.715 → 6.394 beside bwd_states16.
    bwd_store_a1: bool = True
    # The same hand-over on the fp32-operand path (fp32 inputs; 16-bit inputs without half_dots), one P block, the
    # buffer in fp32: there bwd_dqk formed M∘(dY Vᵀ) and, for the halves' dk (no transposed register operands), its
    # transpose from V dYᵀ, two C×C×P tf32x3 dots (six tf32 ones) per head and N block (four N blocks of bn = 32 at
    # N = 128), and loads both from the buffer instead (the transpose through swapped offsets). Results within
    # fp32 rounding of the flag off (the two products' sums in another order). B8 T4096 H32: 268 MB more written.
    # AOT sm_90, fp32, N = 128, P = 64 (8 warps, 255 registers either way), spill stores per thread: bwd_dqk 2312 →
    # 976 B (shared memory 45 → 16 KB), bwd_dv 1196 → 1232. H100 (forty-third session, sweep_siso.py, fp32, the
    # sm_90 tiles), forward+backward 44.03 → 34.77 ms at B8 T4096 and 44.25 → 35.00 at B1 T32768 (bwd_dqk 20.6 →
    # 11.0 ms, bwd_dv 9.9 → 10.2), every error against float64 within 3e-8 of the flag off.
    bwd_store_a1_fp32: bool = True
    # The fp32-operand hand-over with several P blocks (P > bp: P ≥ 64 off sm_90, P = 128 on sm_90): each bwd_dv
    # program stores its P block's share of M∘(dY Vᵀ) in fp32 and bwd_dqk loads the P / bp shares and sums them (the
    # mask distributes over the sum), instead of forming dY Vᵀ and V dYᵀ over P itself in every N-block program.
    # Results within fp32 rounding of the flag off (the P blocks' sums in another order). AOT, spill stores per
    # thread: sm_90 fp32 P = 128 bwd_dqk 2400 → 896 B (shared memory 45 → 16 KB), bwd_dv 1184 → 1264; sm_86 fp32
    # P = 128 (four blocks) bwd_dqk 1276 → 628. H100 (forty-sixth session, sweep_siso.py B8 T4096): sm_90's tiles at
    # P = 128, forward+backward 56.42 → 39.95 ms (bwd_dqk 27.84 → 12.93, bwd_dv 16.68 → 15.31); the other
    # architectures' tiles (c32, 4/4 warps) at P = 64, 30.52 → 28.45 (bwd_dqk 9.68 → 7.48). Not on 16-bit dots:
    # bf16 P = 128 took 10.38 → 11.36 ms there (bwd_dqk 2.74 → 3.51; AOT sm_90 spills 244 → 500 B).
    bwd_store_a1_blocks: bool = True
    # With halves (the fp32-operand path): every kernel loads q, k and the states as contiguous tiles split into
    # even / odd halves in registers, and pair tiles (chunk and final states, bwd_dqk's dq, dk) are stored
    # re-interleaved; False: two stride-2 loads or stores per tile, which fill a quarter of each 32-byte sector.
    # Nsight Compute, H100, fp32 B8 T4096 (forty-fourth session, stride-2): chunk_state_kernel kept L2 76 % busy at
    # 11 % DRAM (4.3 GB written to L2 for 537 MB of states), its loads used 9.8 of 32 bytes per sector, the output
    # kernel's 5.4. Same values move: results within fp32 rounding of stride-2 (the compiler may contract the
    # rotations differently). sweep_siso.py, B8 T4096, sm_90 tiles: H200 (forty-fifth session, the forward only):
    # forward 7.000 → 3.363 ms (chunk_state_kernel 7.11 → 2.33 ms over its three launches, output_kernel 4.14 →
    # 2.16), forward+backward 33.81 → 27.10; H100 (forty-sixth, the backward's loads too): forward+backward 27.85 →
    # 23.73 ms (bwd_dqk 11.33 → 9.09, bwd_dv 10.16 → 8.11), the other architectures' c32 tiles (at 8 backward
    # warps; their dispatcher runs 4) 57.25 → 41.62. AOT, the backward's loads contiguous, spill stores per thread:
    # sm_90 (P = 64) bwd_dv 1232 → 1268 B, bwd_dqk 944 → 992; sm_100 (P = 32) bwd_dv 852 → 876, bwd_dqk 1044 → 1008.
    contiguous_halves: bool = True
    # chunk_state_scan_kernel's walks (forward, the backward's recompute, its reverse pass): each step's loads wait
    # on the chunk's table row, and the select forming cs (which all the step's weights need; Nsight Compute, H100,
    # forty-eighth session: 34 % of the forward scan's warp samples on FSEL) on coefficient loads that wait on that
    # row. Per walk: 1 loads the row a step ahead; 2 the row two steps ahead and the coefficients (cs, scale) one
    # step ahead, carried in registers; 0 neither. Bit-identical. AOT sm_90 registers (forward / recompute /
    # reverse) 185 / 214 / 255 → 201 / 227 / 252 (1), 202 / 225 / 250 (2), no spills. H100, B8 T4096 bf16
    # (sweep_siso.py, alternated runs), all three walks at 0 / 1 / 2: the scan's three launches 1.589-1.620 /
    # 1.527-1.534 / 1.549-1.559 ms, forward 1.263-1.264 / 1.265-1.268 / 1.229-1.234, forward+backward 6.379-6.401 /
    # 6.297-6.312 / 6.332-6.334; then (a later call) (1, 1, 1) / (2, 1, 1) / (2, 2, 1): forward 1.266-1.268 /
    # 1.226-1.231 / 1.225, forward+backward 6.296-6.326 / 6.236-6.237 / 6.286, the scan 1.507-1.512 / 1.472-1.476 /
    # 1.508. So the forward walk prefetches its coefficients too, the backward's walks the row only.
    scan_prefetch: tuple = (2, 1, 1)
    # output_kernel's two loops over N blocks (the scores Q̃K̃ᵀ, then the inter-chunk term Q̃Sᵀ): unroll factors
    # (Triton's IR unroller; 1 = a loop), so the next block's q / k rows and states load before this block's dots
    # (Nsight Compute, H100, forty-eighth session: 24 % of the bf16 output kernel's warp samples waited on those
    # loads, at 12.5 % occupancy). Same operations in the same order: bit-identical. None: the launcher's choice by
    # path and architecture (``output_unroll_factors``). AOT, N = 128, registers / spill bytes per thread:
    # - bf16 (two 64-wide blocks; 2 unrolls a loop fully), sm_90: (1, 1) 254 / 0, (2, 1) 255 / 0, (1, 2) 243 / 0,
    #   (2, 2) 255 / 8; sm_100 (2, 2) 243 / 0; sm_80 / 86 / 89 / 120 (mma.sync) (2, 2) 255 / 48-64, (2, 1) and
    #   (1, 2) no spills;
    # - fp32 (four 32-wide halves blocks), sm_90: (1, 1) 252 / 0, (2, 2) 255 / 76, (4, 4) 255 / 1588.
    # H100, B8 T4096 bf16 (forty-ninth session, sweep_siso.py, alternated): output kernel (1, 1) 0.613-0.622 ms,
    # (2, 1) 0.568-0.580, (1, 2) 0.593-0.594, (2, 2) 0.559; forward 1.231-1.233 / 1.188 / 1.208-1.211 / 1.174,
    # forward+backward 6.203-6.281 / 6.185-6.251 / 6.216-6.226 / 6.171.
    output_unroll: tuple | None = None
    # No register caps (unlike MimoConfig.fwd_out_maxnreg, which trades spills for a CTA more per SM): timed on
    # sm_90 and slower or equal on every kernel tried. H100 (fifty-seventh session, sweep_siso.py, bf16, N = 128,
    # P = 64), B8 T4096 forward / forward+backward 1.173 / 6.199 ms without: output_kernel at 168 registers (472 B of
    # spills, three CTAs per SM) 1.433 / 6.432 (the kernel 0.564 → 0.819), at 128 2.122 / 7.093; the scan's three
    # walks at 168 (72-216 B) 1.279 / 6.832 (1.494 → 2.070), at 128 1.496 / 7.748; B1 T32768, the backward's
    # chunk_state_kernel at 128 (161 registers → 24 B of spills) 7.360 → 7.360 (benchmarks/results/h100_2026-12-07c).

    def __post_init__(self):
        if self.halves and self.half_dots:
            # 16-bit dots on the stride-2 halves compiled but faulted (illegal address) and returned wrong gradients
            # on the H200 (Triton 3.6, bn = 32 and 64; the interpreter runs them exactly): not offered
            raise ValueError("SisoConfig: halves=True needs fp32 dot operands (half_dots=False)")
        if self.fp32_prec not in ("ieee", "tf32x3"):
            raise ValueError(f"SisoConfig: fp32_prec must be 'ieee' or 'tf32x3', got {self.fp32_prec!r}")
        if len(self.scan_prefetch) != 3 or any(x not in (0, 1, 2) for x in self.scan_prefetch):
            raise ValueError(f"SisoConfig: scan_prefetch must be three of 0, 1, 2, got {self.scan_prefetch!r}")
        if self.output_unroll is not None and (len(self.output_unroll) != 2 or
                                               any(not isinstance(x, int) or x < 1 for x in self.output_unroll)):
            raise ValueError(f"SisoConfig: output_unroll must be two unroll factors ≥ 1, got {self.output_unroll!r}")

    def output_unroll_factors(self, arch: int) -> tuple:
        """``output_unroll``, or where it is None the choice for ``arch``: on 16-bit dots (2, 2) on sm_90 (timed)
        and sm_100 (no spills), (2, 1) on the mma.sync architectures (where (2, 2) spills; untimed there); on fp32
        operands (1, 1), whose unrolled loops spill."""
        if self.output_unroll is not None:
            return self.output_unroll
        if not self.half_dots:
            return (1, 1)
        return (2, 2) if arch in (90, 100) else (2, 1)

    def as_dict(self):
        return asdict(self)


def gradient_launch_options(arch: int) -> dict:
    """Launch options of the two gradient kernels (bwd_dv, bwd_dqk) on compute capability ``arch``: on sm_80 an
    explicit ``maxnreg=255`` (``.maxnreg`` in the PTX). Without it the ptxas of Triton 3.6 gives the dispatcher's bf16
    bwd_dqk at N = 128, P = 64 32 registers and 9838 B of spill stores per thread on sm_80 (255 / 1876 B with it;
    the same PTX gets 255 / 1952 B on sm_86 without it), and the fp32 bwd_dv at chunk 64 32 / 20624 B (255 / 3024);
    no other gradient kernel's allocation changes on sm_80 (AOT, every ``aot_launches`` entry). Not applied to the
    chunk-state and output kernels, where it only raised register counts (e.g. 96 → 108, fp32 72 → 104) without
    spills to remove. Elsewhere nothing: the timed compiles stay as they are."""
    return {"maxnreg": 255} if arch == 80 else {}


# Worst case over kernels, dtypes and CI archs (AOT, N = P = 128), bytes of shared memory (dynamic + static).
# A device reporting less falls back to a smaller chunk; below the smallest, choose_config raises.
_SMEM_NEED = {64: 67_584, 32: 51_200, 16: 43_008}


def choose_config(spec: DeviceSpec, problem: SisoProblem) -> SisoConfig:
    # 16-bit dots only on the 64×64 (bn × bp) tiles verified on the H200 (Triton 3.6). With narrower tiles the
    # interleaved-pair path returned wrong outputs or dq (N = 16, 32, 256 with P = 16/32), or faulted (N = 32,
    # P = 16), in bf16 and fp16, while the interpreter ran the same tiles exactly and the fp32 path was right at
    # every N and P; those shapes take the fp32 path (slower dots, exact results).
    half_dots = problem.dtype != "fp32" and problem.dstate >= 64 and problem.headdim >= 64
    if half_dots:
        bn, bp, default_order = 64, 64, [64, 32, 16]
        halves, fp32_prec = False, "ieee"
    else:
        # fp32 dot operands on tensor cores with tf32x3 (three tf32 products: fp32-accurate). IEEE (FMA) dots were
        # slower and, with 32- or 64-wide reductions, made ptxas spill 8-47 KB per thread. The rotation pairs' even
        # and odd halves are separate dot operands (never re-interleaved for a dot; see contiguous_halves for how
        # they move) where they are ≥ 16 wide (tl.dot's K ≥ 16): bn = 32; N = 16 has 8-wide halves and takes one
        # interleaved 16-wide block.
        # Chunk 64 with 64-wide P blocks only on sm_90 (wgmma): elsewhere tf32x3 at chunk 64 sends ptxas into the
        # spill-everything mode (AOT: 28-35 KB per thread in bwd_dv/bwd_dqk on sm_80/89/120), chunk 32 with
        # 32-wide blocks compiles with ≈1 KB. H200, B8 T4096 fp32: chunk 64 7.4 / 49.0 ms, chunk 32 15.5 / 60.4 ms
        # (fwd / fwd+bwd; IEEE at chunk 32: 132 / 201, the former 16-wide IEEE tiles 16.2 / 67.7).
        wide = spec.arch == 90
        bn = 32 if problem.dstate >= 32 else 16
        bp = min(64 if wide else 32, problem.headdim)
        default_order = [64, 32, 16] if wide else [32, 16]
        halves, fp32_prec = bn >= 32, "tf32x3"
    want = problem.chunk_size
    if want is not None and want not in CHUNKS:
        raise ValueError(f"SISO Triton kernels support chunk_size 16, 32 or 64, got {want}")
    order = [want] if want is not None else default_order
    for chunk in order:
        if _SMEM_NEED[chunk] <= spec.smem_optin:
            # 8 warps only for 64-row chunks with bp ≥ 32 and bn = 64 (or 32-wide halves) (three C×bp / C×C
            # accumulators live at once); fewer rows or narrower tiles: 4 warps already cover them. 64-row ×
            # 16-column tiles at 8 warps are miscompiled by Triton 3.6 on Hopper (MIMO's output and dv kernels
            # fault or return wrong values there, measured on the H200; the interpreter runs the same tiles
            # exactly), so they are never chosen.
            warps_bwd = 8 if chunk == 64 and bp >= 32 and (bn >= 64 or bn >= 32 and halves) else 4
            return SisoConfig(chunk=chunk, bn=bn, bp=bp, warps_chunk=4, warps_bwd=warps_bwd, stages=1,
                              half_dots=half_dots, halves=halves, fp32_prec=fp32_prec)
    raise RuntimeError(
        f"no SISO configuration fits {spec.name} (sm_{spec.arch}): shared-memory opt-in limit "
        f"{spec.smem_optin} B, but chunk {order[-1]} needs about {_SMEM_NEED[order[-1]]} B")


def problem_for(q: torch.Tensor, v: torch.Tensor, chunk_size):
    dt = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[v.dtype]
    return SisoProblem(dtype=dt, dstate=q.shape[-1], headdim=v.shape[-1], chunk_size=chunk_size)


def describe(spec: DeviceSpec) -> list[dict]:
    out = []
    for dt in ("bf16", "fp32"):
        prob = SisoProblem(dtype=dt, dstate=128, headdim=64)
        cfg = choose_config(spec, prob)
        for kern in ("chunk_sums", "rotation_planes", "chunk_state", "state_passing", "output", "bwd_dv", "bwd_dqk",
                     "angle_bwd"):
            out.append({"kernel": f"siso.{kern}", "config": cfg.as_dict(), "problem": asdict(prob)})
    return out


def aot_launches(arch: int):
    from .launches import aot_launches as _impl

    return _impl(arch)
