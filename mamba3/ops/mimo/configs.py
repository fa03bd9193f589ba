"""Tile configurations of the MIMO kernels, the dispatcher's choice, and the AOT launch list.

Every MIMO kernel computes in fp32 registers (inputs are widened on load; dots take fp32 operands as tf32 /
tf32x3, except the forward's token-by-token dots for 16-bit inputs, which take 16-bit operands: half the
bytes), so the shared memory a kernel needs depends only on its tile sizes — BM (rows = (token, rank)
pairs), BK (half-columns of an N-pair block) and BP (P rounded up to a power of two, at least 16) — and
never on N, T, the batch or R; 16-bit inputs need at most what fp32 inputs need. Nothing is
software-pipelined (num_stages=1: the loops are short and latency-bound, and Blackwell must not pipeline).
Shared memory is spent on the operands of the dots that are live at the same time; ``smem_estimate`` is an
upper bound that counts every operand buffer of the largest kernel without any reuse, and the AOT lane checks
the real number for every configuration listed by ``aot_launches``.

Measured (AOT, triton 3.6, all 70 launches of ``aot_launches`` per architecture): largest total shared memory
65,536 B on sm_86 and 66,560 B on sm_120 (the N=256 output kernel) against 101,376 B; 99,328 B on sm_90 (the fp32
P=128 output kernel: Hopper's wgmma keeps operands in shared memory) against 232,448 B. fp32 at N=128, P=64, R=4 —
the seed's worst case — needs at most 33,792 B on sm_86/89/120.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

#: P buckets the kernels are compiled for (BP = next power of two ≥ max(P, 16)).
P_BUCKETS = (16, 32, 64, 128)
SUPPORTED_N = (16, 32, 64, 128, 256)
SUPPORTED_R = (1, 2, 4, 8)


@dataclass(frozen=True)
class MimoConfig:
    """One configuration for all MIMO kernels.

    bm: rows per token tile of the forward kernels (output, chunk states, epilogue backward). 64 rows = 16
        tokens at R=4 (the official chunk), 8 at R=8, 64 at R=1: the largest tile whose [BM, BM] score block
        and [BM, BP ≤ 128] value block stay in registers at 8 warps.
    bm_bwd: rows per token tile of the dq/dk/dv kernels. They hold more live tiles (dy, ṽ, two accumulators
        per half) than the forward, so at P = 128 they use 32-row tiles to stay within 99 KiB and without
        register spills.
    bk / bk_bwd: half-columns per N-pair block of the forward / backward kernels. 64 covers N ≤ 128 in one
        block, so the query (forward) or key (dv) tile is rotated once and reused across the in-chunk loop
        (``ONE_K``); larger N loops over blocks at the same footprint. The backward kernels hold more live
        tiles and use 32.
    state_tiles: forward token tiles per state chunk. The (P×N) state is materialised once per state chunk
        and each tile loops over the earlier tiles of its chunk ((state_tiles + 1) / 2 tiles on average): 2
        balances the two (H200, bf16, B=8, T=4096, P=64, R=4, ``bench_mimo.py --sweep``: forward / forward +
        backward ms with 1, 2, 4, 8 tiles: 14.6 / 71.4, 12.7 / 69.5, 13.4 / 80.1, 16.8 / 108.0; the other P
        buckets were not measured and take the same value). Since q/k rotations are loaded, not computed (ninth
        session): 10.6 / 55.4, 10.3 / 57.9, 11.5 / 68.5, 14.6 / 91.4 — 1 is 4 % faster for forward+backward and
        3 % slower forward. With 4-warp tiles (twelfth session; B=8 T=4096 / B=1 T=32768): 2 tiles 6.08 / 35.0
        and 6.75 / 36.8 ms, 1 tile 6.84 / 35.2 and 7.65 / 37.3 ms: 2 stays.
    bp_state: P block of the chunk-state (outer product) kernel; 64 bounds its two [BP, BK] accumulators.
    warps / warps_bwd / state_warps: warps of the output kernel (forward and epilogue backward) / the dq, dk, dv
        kernels / the chunk-state kernel. Every one of them is register-bound (≈ 255 registers) and latency-bound:
        4 warps let two CTAs share an SM where one 8-warp CTA ran alone, at the price of some spills (AOT sm_90,
        bf16: ≤ 292 B; sm_86/120: ≤ 540 B). H200, P = 64, bf16, B=8, T=4096, forward / forward+backward ms:
        8 warps everywhere 9.22 / 56.6; output and chunk-state kernels at 4: 6.06 / 47.5; all three at 4:
        6.08 / 35.0. Set per P bucket in ``CONFIGS``: every bucket's first configuration at 4 warps. Other
        architectures were not measured.
        The output kernel's epilogue backward alone at 8 warps (its spills at 4: P = 128 2488 B per thread, P = 64
        on the chunked path 248 B; at 8: 192 and 0, one CTA per SM; AOT sm_90, bf16) was slower wherever timed
        (H200, fifty-eighth session, bf16, forward+backward ms): B8 T4096 P = 64 (the scan) 23.87 → 24.10, P = 128
        73.34 → 76.26, B1 T32768 30.10 → 34.69 (the kernel 8.76 → 13.43); that option was removed.
    stages: 1 everywhere (no software pipelining: short latency-bound loops, and Blackwell must not pipeline).
    fwd_dots16: for bf16/fp16 inputs, the forward's token-by-token dots (chunk states, scores, values) take 16-bit
        operands (H200, B=8, T=4096, P=64: forward 10.54 → 9.34 ms); off, they run as tf32 on fp32 operands like
        every other dot.
    bwd_dots16: for bf16/fp16 inputs, the dq, dk and dv kernels' dots take 16-bit operands (fp32 accumulation;
        half the MMA work of tf32 and half the operand bytes: AOT sm_90, P=64, static HGMMA count 40 / 40 / 32 →
        28 / 28 / 16), the rotated q̃ / k̃ of the dq / dk products as hi + lo halves (the angle gradient cancels).
        Interpreter, bf16, T=256, N=128, P=64, R=4, every feature: worst gradient error 3.2e-3 → 4.6e-3 (d_q);
        N = 16 / 32 / 64 at T=19, 4 seeds each: at most 5.6e-3 (d_trap; tf32: 6.9e-3, d_D). Kept tf32: Σ dy q̃ᵀ (16-bit
        operands there took the input-state gradients from ≤ 3.4e-3 to 9.1e-3), the epilogue's recompute of y
        (with the forward's 16-bit scores d_q_bias went from ≤ 2.5e-3 to 8.9e-3 at N=16), and dy itself (fp32:
        a bf16 dy took d_D from ≤ 2.6e-3 to 5.6e-3). On the H200 the 64-row, 4-warp configurations (P = 32, 64)
        return a wrong dq with it on 32-column N-pair blocks (d_q 0.8-1.3 relative; suspected Triton 3.6 miscompile,
        the interpreter runs them right); on 64-column blocks (``bk_bwd16``) P = 64 is right and P = 32 returns a wrong
        dv instead (d_v 75 relative); P = 16 and 128 pass.
        On for P = 64 (with ``bk_bwd16`` = 64): H200, bf16, B=8, T=4096, forward+backward 35.65 → 33.64 ms with the
        chunked forward, 32.51 → 30.85 with the scan forward (twenty-sixth session).
    bk_bwd16: half-columns per N-pair block of the dq, dk and dv kernels where ``bwd_dots16`` applies (16-bit
        inputs; 0: ``bk_bwd``). At 64 each (tile, head) forms dy·ṽᵀ once instead of once per 32-column block, at
        more spills (AOT, bf16, P = 64, 4 warps, dq / dk / dv: 1156 / 828 / 108 B on sm_90 and 1200 / 708 / 140 B on
        sm_86, against 132 / 156 / 168 and 128 / 52 / 100 B with tf32 dots at 32; shared memory ≤ 25.6 KB). fp32
        inputs keep ``bk_bwd`` (at 64 they spill 2-31 KB per thread). :meth:`for_dtype` resolves it.
    scan_gather: the scan kernel (forward walk and states-only walk) loads its per-token and per-rank operands (sin /
        cos, biases, v, ψ, z) once per tile row instead of once per token or rank broadcast through reshapes, each of
        which Triton lowers to a layout conversion through shared memory. The same values, hence bit-identical
        results. AOT sm_90, bf16, P = 64, per chunk: the forward walk's barriers 56 → 39, instructions 2027 → 1922,
        spill reloads 31 → 8 (spills 208 → 88 B), global loads 57 → 82; the states-only walk's barriers 18 → 7,
        instructions 586 → 611. H200, bf16, B8 T4096, forward / forward+backward: 5.24 / 30.47 ms broadcast, 4.82 /
        29.53 gathered (twenty-eighth session), so it is on. The same change elsewhere trades barriers for spills
        (AOT sm_90, bf16): the chunk-parallel dq kernel 74 → 42 barriers but 189 → 361 reloads per head, the
        output kernel's backward pass 117 → 81 barriers but spills 264 → 712 B, the backward's reverse state walk
        (``mimo_state_scan_bwd_kernel``) 35 → 19 barriers but 19 → 88 reloads per chunk; so they broadcast.
        (Loading each walk's next token range a step ahead, as SISO's ``scan_prefetch``, was timed on the H100 in the
        forty-ninth session: 28.46 against 28.30 ms forward+backward at B8 T4096; removed.)
    bwd16_dqk: with ``bwd_dots16``, whether the dq and dk kernels take 16-bit dots on ``bk_bwd16`` blocks too (True)
        or keep tf32 dots on ``bk_bwd`` blocks, the dv kernel alone running 16-bit on ``bk_bwd16`` blocks (False, the
        default). H200, P = 64, bf16, B8 T4096, per kernel of one forward+backward (twenty-sixth session,
        torch.profiler): dq + dk 9.78 ms at tf32 on 32-column blocks, 10.35 at 16 bits on 64; dv 6.19 → 4.04. End to
        end with the scan forward (twenty-eighth session): forward+backward 30.47 ms with 16-bit dq / dk, 30.03
        without.
    save_y: the forward keeps y before the output epilogue (TT, R, H, P) fp32 for the backward, whose epilogue
        backward then reads it instead of computing it again from the states, the scores and the values (the output
        kernel's backward pass: 5.53 of 29.0 ms at B=8, T=4096, H200, twenty-ninth session). Costs memory: R·H·P
        fp32 per token kept from the forward to the backward (1.07 GB at B=8, T=4096, H=32, P=64, R=4; the inputs
        it is computed from take ≈ 0.4 GB in bf16). H200, bf16, N = 128, P = 64, R = 4, forward / forward+backward
        ms (thirty-ninth session, ``bench_mimo.py --sweep``): B8 T4096 (scan forward) 4.82 / 29.08 → 5.20 / 25.16,
        B1 T32768 (chunked forward) 6.23 / 33.22 → 6.51 / 28.90. Off by default for the memory; the public
        ``mamba3_mimo(save_y=True)`` (and ``Mamba3(mimo_save_y=True)``) turns it on.
    save_y16: with ``save_y`` and bf16 inputs, y is kept in bf16 (half the memory: 0.54 GB at the shape above; the
        backward's epilogue then differentiates at a y rounded to bf16, as it rounds its output). Interpreter, bf16,
        T = 19, every feature, scan and chunked: worst gradient error 3.48e-3 with fp32 y, 3.26e-3 / 3.32e-3 with bf16
        y (fortieth session). fp16 and fp32 inputs keep y in fp32 (fp16's range could overflow where the normalised
        output would not). H100 (forty-first session, ``bench_mimo.py --sweep``), bf16, forward+backward ms against
        fp32 y: B8 T4096 (scan) 25.13 → 25.51, B1 T32768 (chunked) 30.00 → 30.85: slower (the forward's stores
        are halved, 5.24 → 4.89 ms at B8, but the backward loses more), so off; it buys back half of ``save_y``'s
        memory for about a tenth of its gain. Tested on every configuration (``tests/gpu/test_mimo.py``). It also
        sets the dtype of ``bwd_walk_y``'s backward-only buffer (sweep variant ``-scan-walky16``): H100 (fifty-sixth
        session), B8 T4096, forward+backward 24.40 ms with fp32 y, 24.83 with bf16 (the walk 7.20 → 6.96 ms for
        both walks, the output kernel's backward that loads y 1.41 → 2.10), so that buffer stays fp32.
    bwd_store_dpw: the dv kernel, which forms the weighted scores' gradient W ∘ dP of every in-chunk pair block for its
        log-decay partials, stores it ([BM, BM] per key tile, head and query tile of the chunk, for the backward's
        duration); the dq and dk kernels, launched after it, load it instead of forming it again from dy and ṽ once per
        N-pair block each. The dq / dk products then take dP as the dv kernel's dots give it (16-bit operands where
        ``bwd_dots16``). Stored in fp32 where the dq / dk dots are tf32 / tf32x3 (the default: 1.07 GB at B=8, T=4096,
        H=32, R=4, one tile per state chunk), in the 16-bit operand dtype where they take 16-bit operands
        (``bwd16_dqk``: they round it so anyway). AOT sm_90, bf16, P = 64, spilled bytes per thread dq / dk / dv 132 /
        156 / 108 → 72 / 52 / 188 (92 / 64 / 208 as timed below, before the block's store moved after the dv dot and its
        addressing into ``tiles.pair_block_ptrs``). H100 (fortieth session, two machines; bf16, B=8, T=4096, the scan
        variant, ``bench_mimo.py --sweep``), forward+backward ms: 29.29 → 28.88, 29.44 → 28.96; with ``save_y`` 25.64 →
        25.22, 25.81 → 25.34; H200 29.21 → 28.64. On in :meth:`scan_variant`. The chunked P = 64 configuration (two
        tiles per state chunk: twice the blocks, 2.15 GB at 32768 tokens), H100, forty-first session: bf16 B1 T32768
        34.10 → 33.43 ms (at one tile 36.19 → 35.65); fp32 inputs (tf32x3: three products per formed dP) B1 T32768
        154.15 → 99.68, B8 T4096 154.94 → 99.86 (``benchmarks/results/mimo_dpw_chunked_sweep.md``); on there. On in
        every other bucket's first configuration since the forty-second session (timings at ``CONFIGS``).
    dpw16: with ``bwd_store_dpw`` and 16-bit inputs, the blocks stored in bf16 where the dq / dk dots are tf32 (which
        widen them back): half the memory and traffic (0.54 GB at B=8, T=4096 in the scan variant, 1.07 GB in the
        chunked one at 32768 tokens), dP rounded once to bf16 as 16-bit dq / dk dots (``bwd16_dqk``) round it; bf16
        also for fp16 inputs (fp32's range: dP is not bounded by the inputs'). fp32 inputs keep fp32 blocks.
        Interpreter, bf16, 16-bit backward dots: d_q 2.51e-3 → 2.69e-3 against float64 (``bwd16_dqk``: 3.44e-3).
        AOT sm_90, P = 64, spilled bytes per thread dq / dk / dv 72 / 52 / 188 → 196 / 44 / 200 (the widening).
        H100 (forty-second session, ``bench_mimo.py --sweep``), bf16, P = 64, forward+backward ms with fp32 →
        bf16 blocks: B8 T4096 (scan) 28.81 → 28.35, with ``save_y`` 25.16 → 24.71, B1 T32768 (chunked) 33.47 →
        32.79; peak memory 8.14 → 7.61 GB at B8; worst gradient error against float64 d_q 3.02e-3 → 3.08e-3 at B8.
        On in P = 64's configuration, and in every other bucket's first one since the forty-third session (H100, bf16,
        B8 T4096, forward+backward ms with fp32 → bf16 blocks: P = 16 25.35 → 24.53, P = 32 28.76 → 27.62, P = 128
        82.32 → 81.71; worst gradient error against float64 at P = 128 3.86e-3 → 4.72e-3).
    bm_fp32: the token tile's rows for fp32 inputs where they differ from ``bm`` (0: ``bm``), applied by
        :meth:`for_dtype` to the chunked kernels: the backward's tile capped to it (unless ``bm_bwd_fp32``) and
        ``state_tiles`` scaled so the state chunk keeps its length. fp32 inputs take tf32x3 dots (three products
        per tile), which spill at 64 rows: AOT sm_90, P = 64, N = 128, spilled bytes per thread at 64 → 32 rows:
        output kernel 4148 → 680, chunk state 136 → 0, dq / dk / dv (with ``bwd_store_dpw``) 616 / 60 / 1444 → 752 /
        72 / 760. H100 (forty-second session, ``bench_mimo.py --sweep``), fp32, P = 64, with ``bwd_store_dpw``,
        forward / forward+backward ms at 64 → 32 rows: B8 T4096 32.60 / 99.31 → 15.17 / 86.37, B1 T32768 32.52 /
        98.99 → 15.26 / 86.65: on in P = 64's configuration. (The forward halves; the backward, its recompute
        included, goes from 66.7 to 71.2 ms.) On in P = 128's (with ``bm_bwd_fp32``, below), off in P = 32's (H100,
        forty-third session: 50.63 → 70.41 ms).
    bm_bwd_fp32: with ``bm_fp32``, the dq / dk / dv kernels' rows for fp32 inputs (0: ``bm_bwd`` capped to
        ``bm_fp32``); longer or shorter than the forward's tile, dividing the state chunk (the backward's tiles have
        their own tables). Why 64: the 64-row backward took less time than the 32-row one above. Why 16: AOT sm_90,
        fp32, N = 128, spill stores per thread of dq / dk / dv at 32 → 16 rows: P = 64 752 / 72 / 760 → 0 / 0 / 0,
        P = 128 2568 / 2268 / 3548 → 176 / 72 / 628. H100 (forty-third session), fp32, B8 T4096, forward+backward
        ms at 32 → 16 rows: P = 128 217.07 → 141.97 (on in its configuration), P = 64 86.40 → 100.52 (off there);
        64 rows at P = 64 not timed yet (``bench_mimo.py --sweep --only=w4-fp32bwd64/float32``).
    bk_dv: the dv kernel's N-pair block where it differs from ``bk_bwd`` (0: ``bk_bwd``): set by :meth:`for_dtype`
        from ``bk_bwd16`` when ``bwd16_dqk`` is off; read through :attr:`dv_block`.
    scan_fwd: the forward (not the backward's recompute) as one walk per (sequence, head, P block) over its state
        chunks, the state held in registers (``mimo_scan_out_kernel``), in place of the chunk-state, state-passing
        and output kernels, between which the fp32 state of every state chunk crosses DRAM four or five times
        (1.07 GB per crossing at B=8, T=4096, H=32, P=64, N=128 with 32-token state chunks). True needs
        state_tiles = 1 (each state chunk one token tile) and runs where N/2 ≤ bk (else the chunked forward runs);
        None: the launcher decides per call (:func:`for_grid`), running :meth:`scan_variant` where the rule holds.
        Its parallelism is sequences × heads × P blocks, so it only suits grids that fill the GPU. H200, bf16, N =
        128, P = 64, R = 4, 16-token chunks (twenty-fifth session), forward / forward+backward ms: B8 T4096 (256
        programs) scan at P block 64 × 8 warps 5.19 / 33.97, at 32 × 8 warps 8.57 / 37.30, chunked at 1 state tile
        6.87 / 35.60, at 2 (the default) 6.10 / 35.28; B4 T8192 (128 programs) scan at 64 × 8 warps 5.34 / 34.26,
        chunked at 2 tiles 6.16 / 35.68; B1 T32768 scan at 32 × 8 warps (64 programs) 16.88 / 46.06, chunked at 1
        tile 7.15 / 36.19 (``benchmarks/results/mimo_scan_sweep_h200.md``). At P block 32 × 4 warps the 16-bit
        kernel returned wrong outputs and faulted on the H200 (the interpreter runs it right; as the P = 32, 4-warp
        output kernel, below), so it is not offered.
    scan_bp: P block of ``mimo_scan_out_kernel`` (0: all of P; the fused RMSNorm always takes all of P). Smaller
        blocks hold less state per program and make more programs, and recompute the scores once per block.
    scan_warps: warps of ``mimo_scan_out_kernel`` (the forward walk and the backward's states-only one): at 8, 255
        registers and one CTA per SM (AOT sm_90 bf16, 84 B of spills at P block 64); at 4 the walks keep 255
        registers (548 B of spills in the forward walk) and two CTAs share an SM, so B8 T4096's 256 programs run in
        one wave instead of two. :func:`for_grid` falls back to 8 where the grid fills only one CTA per SM (B4
        T8192's 128 programs: 4.86 / 27.95 ms at 8 warps against 5.95 / 29.27 at 4, H100).
    scan_states: with the scan forward, the backward's recompute of the state entering each state chunk as the
        same walk without outputs (``mimo_scan_out_kernel`` STATES), in place of the chunk-state kernel (which writes
        every chunk's local ΔS) and the state pass (which reads it and writes the states): at 16-token state chunks
        (B=8, T=4096, H=32, P=64, N=128) 2.1 GB cross DRAM once instead of three times.
    scan_dstates: with the scan forward, the backward's reverse state pass as one walk per (P block × N-pair block,
        sequence, head) that forms each chunk's local dS on the way (``mimo_state_scan_bwd_kernel``), in place of the
        chunk-state kernel (MODE 1: writes every local dS) and ``mimo_state_bwd_kernel`` (reads it and the incoming
        states, writes dS_end): two of its four 2.1 GB crossings at B=8, T=4096 fewer.
        Both are on in :meth:`scan_variant`. H200, bf16, N = 128, P = 64, R = 4, 16-token chunks (twenty-sixth
        session), forward+backward ms with the scan forward: B8 T4096 neither 34.02, scan_states 33.43, scan_dstates
        32.84, both 32.24; B4 T8192 34.15, 33.48, 34.28, 33.60 (``benchmarks/results/mimo_backward_sweep_h200.md``).
    bwd_states16: with 16-bit inputs, the copies of the states that the backward's chunk kernels read — the state
        entering each state chunk (the epilogue backward's recompute of y, dq̃, the reverse pass's decay gradient) and
        dS at each chunk's end (dk̃, dṽ) — are stored in bf16 (also for fp16 inputs: the states are not bounded by the
        inputs' range), by the scan passes (``scan_states``, ``scan_dstates``) or the chunked ones. The passes carry S
        and dS in fp32 as before, so nothing compounds across chunks; each chunk's products see its state rounded
        once to bf16 (the dv kernel's 16-bit dots round it so anyway; the tf32 ones widen it back). The forward is
        not touched. Halves the 2.1 GB of each crossing at B=8, T=4096, H=32, P=64, N=128 (six crossings per
        backward). fp32 inputs keep fp32. On in every bucket's first configuration (timings above ``CONFIGS``).
    bwd_walk_y: with ``scan_states`` (and without ``save_y``), the backward's states-only walk also forms y before
        the epilogue, as the forward walk did, into a buffer that lives through the backward only (``ys_dtype``;
        1.07 GB at B=8, T=4096, H=32, P=64, R=4), and the output kernel's backward loads it instead of forming it
        again from the states. H100 (fifty-fifth session), B8 T4096: that recompute is 3.8 of the output
        kernel's backward's 5.2 ms (``save_y``: 1.39 ms), the states-only walk ≈ 1.0 ms and the forward walk
        3.4. With the flag the walk takes ≈ 3.9 ms (it stores 1.07 GB of fp32 y) and the output kernel's backward
        1.39: forward+backward 25.37 → 24.54 ms, peak memory 5.46 → 6.53 GB (the buffer). On in P = 64's
        configuration (the only one with the scan forward).
    fwd_out_maxnreg: a register cap for the chunked forward's output kernel with 16-bit inputs on sm_90 (0: none;
        ``output_launch_options``; only where N fits one block, ``output_maxnreg``). It runs at 189 / 248
        registers at P = 64 / 32 (AOT sm_90, bf16, N = 128; 66.5 KB of shared memory), two 4-warp CTAs per SM; at
        168 it spills 40 / 72 B per thread and three CTAs share an SM.
        H100 (fifty-sixth session), bf16, forward / forward+backward ms without → with the cap: P = 64 B1 T32768
        6.64 / 31.47 → 6.03 / 30.91 (the output kernel's forward and backward 9.24 → 8.65), P = 32 B8 T4096 5.65 /
        26.94 → 5.07 / 26.35; the errors against float64 the same numbers. Set in those two buckets' first
        configurations, and at 128 in P = 16's (where ptxas gives it 168 anyway; no spills at 128: 4.81 / 23.96 →
        4.40 / 23.53, fifty-seventh session). At P = 128 it spills 512 B at 168 and was slower: 13.66 / 77.71 →
        14.21 / 78.40.
        Other architectures keep ptxas's choice: a 99 KB GPU holds one such CTA per SM and sm_80 two, so the cap
        would only add spills there, and sm_100 was not timed. The same cap on the dq, dk and dv kernels (three CTAs
        per SM; AOT sm_90 bf16 P = 64 spills 712 / 368 / 584 B at 168) was timed and removed: P = 64 B8 24.42 →
        30.58 ms (dq / dk 7.91 → 12.63), at 128 registers 37.24; P = 16 / 32 / 128 23.99 / 26.94 / 78.03 → 25.44 /
        30.65 / 90.83; B1 31.47 → 37.33.
    bwd_out_maxnreg / state_maxnreg: the same kind of cap (sm_90, 16-bit inputs) for the output kernel's backward /
        the chunk-state kernel (both modes), chosen where AOT sm_90 (bf16, N = 128) shows a CTA more per SM for few
        spills. Registers → cap: stack bytes per thread: P = 16 output kernel backward 204 → 168: 24 B, chunk states
        122 / 125 → 96: 48 / 56 B (five CTAs instead of four); P = 32 output kernel backward 246 → 168: 88 B, chunk
        states 230 / 243 → 168: 24 / 64 B; P = 128 chunk states 228 / 179 → 168: none. H100 (fifty-seventh
        session), bf16, B8 T4096, forward / forward+backward ms without → with each: P = 16 output backward 23.96 →
        22.98 (that kernel's forward and backward 7.62 → 6.64), chunk states at 96 23.96 → 23.96 (not set); P = 32
        output backward 26.43 → 25.81, chunk states 5.05 / 26.43 → 4.84 / 25.88; P = 128 chunk states 13.66 / 77.71
        → 12.75 / 75.45 (that kernel 11.36 → 9.06). Set where they won. P = 64's chunk states spill 440 / 344 B at
        168: B1 T32768 31.03 → 32.82 ms (not set); its output kernel's backward spills 1112 B (not timed).
    bk_dqk90 / warps_dqk90: the dq and dk kernels' N-pair block and warps for 16-bit inputs on sm_90 (0: ``bk_bwd`` /
        ``warps_bwd``; :meth:`dqk_tiles`). At 64 columns and 8 warps each (tile, head) loads its dy, ṽ, weighted dP
        and state blocks once instead of once per 32-column block, in half the programs, for the same instructions:
        AOT sm_90, bf16, N = 128, P = 64, the head loop's SASS per warp dq / dk 1839 / 1711 at 32 columns and 4
        warps (two blocks: 28,400 warp instructions per tile and head), 1705 / 1824 at 64 and 8 (28,232), spill
        stores 176 / 28 → 20 / 72 B per thread, one 8-warp CTA per SM in place of two 4-warp ones. Hopper only: its
        wgmma keeps the B operands in shared memory; on sm_86 / sm_120 the same tiles spill 972 / 1300 B. At P = 128
        (dy [32, 128] per tile) the head loop takes 33,760 → 23,608 warp instructions per tile and head. Not timed
        yet (sweep variants ``-scan-dqk64w8``, ``-dqk64w8``, ``-dqk64w8-P128``); off everywhere.
    dstates_bk / dstates_maxnreg: the N-pair block of the backward's reverse state walk (``scan_dstates``:
        ``mimo_state_scan_bwd_kernel``; 0: ``bk``) and its register cap (sm_90, 16-bit inputs; 0: none). B8 T4096 runs
        256 walks (P = 64, N = 128) at 255 registers, two 4-warp CTAs per SM; on 32-column blocks twice as many walks,
        each with half the state, and at 128 registers four CTAs share an SM, so the 512 still run in one wave (AOT
        sm_90, bf16: 248 registers without a cap, 272 B of spills at 128, 84 B at 168 (three CTAs: two waves); the
        chunk step 1371 → 1046 instructions per warp). Not timed yet (sweep variants ``-scan-dsb32r128``,
        ``-scan-dsb32r168``); off everywhere.
    """

    bm: int = 64
    bm_bwd: int = 64
    bk: int = 64
    bk_bwd: int = 32
    state_tiles: int = 2
    bp_state: int = 64
    warps: int = 8
    warps_bwd: int = 8
    state_warps: int = 8
    stages: int = 1
    fwd_dots16: bool = True
    bwd_dots16: bool = False
    bk_bwd16: int = 0
    bwd16_dqk: bool = False
    save_y: bool = False
    save_y16: bool = False
    bwd_store_dpw: bool = False
    dpw16: bool = False
    bm_fp32: int = 0
    bm_bwd_fp32: int = 0
    bk_dv: int = 0
    scan_fwd: bool | None = False
    scan_bp: int = 0
    scan_warps: int = 8
    scan_states: bool = False
    scan_dstates: bool = False
    scan_gather: bool = True
    bwd_states16: bool = False
    bwd_walk_y: bool = False
    fwd_out_maxnreg: int = 0
    bwd_out_maxnreg: int = 0
    state_maxnreg: int = 0
    bk_dqk90: int = 0
    warps_dqk90: int = 0
    dstates_bk: int = 0
    dstates_maxnreg: int = 0
    name: str = "default"

    def __post_init__(self):
        if self.scan_fwd and self.state_tiles != 1:
            raise ValueError(f"MimoConfig {self.name}: scan_fwd needs state_tiles=1 (one token tile per state "
                             f"chunk), got {self.state_tiles}")

    def scan_variant(self) -> "MimoConfig":
        """This configuration with the scan forward and the backward's two state passes as scans (``scan_states``,
        ``scan_dstates``), one token tile per state chunk (for the backward's other kernels too: the same speed
        there, H200 B8 T4096 backward 28.7 ms at 1 tile against 29.2 at 2), and the dq / dk kernels loading the
        weighted dP the dv kernel stored (``bwd_store_dpw``)."""
        return replace(self, scan_fwd=True, state_tiles=1, scan_states=True, scan_dstates=True, bwd_store_dpw=True,
                       name=f"{self.name}-scan")

    def for_dtype(self, dtype: torch.dtype) -> "MimoConfig":
        """The tiles the kernels run for inputs of ``dtype``: ``bm_fp32`` rows for fp32 inputs to the chunked
        kernels; the backward's N-pair blocks ``bk_bwd16`` wide where its 16-bit dots apply."""
        if dtype == torch.float32 and self.bm_fp32 and not self.scan_fwd:
            chunk = self.bm * self.state_tiles  # the state chunk's rows, which every tile must divide
            if self.bm_fp32 > self.bm or chunk % self.bm_fp32:
                raise ValueError(f"MimoConfig {self.name}: bm_fp32={self.bm_fp32} must be ≤ bm={self.bm} and "
                                 f"divide the state chunk's {chunk} rows")
            bm_bwd = self.bm_bwd_fp32 or min(self.bm_bwd, self.bm_fp32)
            if bm_bwd > chunk or chunk % bm_bwd:
                raise ValueError(f"MimoConfig {self.name}: bm_bwd_fp32={bm_bwd} must divide the state chunk's "
                                 f"{chunk} rows")
            return replace(self, bm=self.bm_fp32, bm_bwd=bm_bwd, bm_fp32=0, bm_bwd_fp32=0,
                           state_tiles=self.state_tiles * self.bm // self.bm_fp32)
        if dtype != torch.float32 and self.bwd_dots16 and self.bk_bwd16:
            return replace(self, **{"bk_bwd" if self.bwd16_dqk else "bk_dv": self.bk_bwd16})
        return self

    def output_maxnreg(self, bwd: bool, pairs: int) -> int:
        """The output kernel's register cap (0: none) in the forward or its backward, for N = 2·``pairs``: only where
        the kernel takes N in one block (pairs ≤ bk; the caps were timed at N = 128). Over its loop of N blocks (N =
        256) the same caps spill 504-960 B per thread (AOT sm_90, bf16, P = 32 / 64; 0-88 B at N = 128), untimed."""
        if pairs > self.bk:
            return 0
        return self.bwd_out_maxnreg if bwd else self.fwd_out_maxnreg

    def output_options(self, arch: int, bp: int, fp32_inputs: bool, y_io: int, pairs: int, bwd: bool) -> dict:
        """``mimo_out_kernel``'s launch options, for the launcher and the AOT lane alike: its warps, the stages, and
        the register cap of ``output_launch_options`` (``output_maxnreg`` for N = 2·``pairs``)."""
        return dict(num_warps=self.warps, num_stages=self.stages,
                    **output_launch_options(arch, bp, fp32_inputs, y_io, self.output_maxnreg(bwd, pairs)))

    def state_options(self, arch: int, fp32_inputs: bool) -> dict:
        """``mimo_chunk_state_kernel``'s launch options (both modes), for the launcher and the AOT lane alike."""
        return dict(num_warps=self.state_warps, num_stages=self.stages,
                    **register_cap(arch, fp32_inputs, self.state_maxnreg))

    def dqk_tiles(self, arch: int, fp32_inputs: bool) -> tuple[int, int]:
        """(N-pair block, warps) of the dq and dk kernels on compute capability ``arch``: ``bk_dqk90`` /
        ``warps_dqk90`` for 16-bit inputs on sm_90 where set, else ``bk_bwd`` / ``warps_bwd``."""
        if arch == 90 and not fp32_inputs:
            return self.bk_dqk90 or self.bk_bwd, self.warps_dqk90 or self.warps_bwd
        return self.bk_bwd, self.warps_bwd

    def dstates_options(self, arch: int, fp32_inputs: bool) -> dict:
        """``mimo_state_scan_bwd_kernel``'s launch options, for the launcher and the AOT lane alike."""
        return dict(num_warps=self.state_warps, num_stages=self.stages,
                    **register_cap(arch, fp32_inputs, self.dstates_maxnreg))

    @property
    def dstates_block(self) -> int:
        """The reverse state walk's N-pair block: ``dstates_bk`` where set, else ``bk``."""
        return self.dstates_bk or self.bk

    @property
    def dv_block(self) -> int:
        """The dv kernel's N-pair block: ``bk_dv`` where set, else ``bk_bwd``."""
        return self.bk_dv or self.bk_bwd

    def for_chunk(self, rank: int, chunk_size: int | None) -> "MimoConfig":
        """The tile for this rank, capped by the caller's chunk_size (tokens): at least 16 rows (tl.dot's
        minimum). The math does not depend on the tiling."""
        ct = self.bm // rank
        if chunk_size is not None:
            ct = max(min(ct, chunk_size), max(1, 16 // rank))
        bm = ct * rank
        if bm == self.bm:  # the backward's tile may be longer than the forward's (``bm_fp32``), within the state chunk
            return self
        return replace(self, bm=bm, bm_bwd=max(16, min(self.bm_bwd, bm)))

    def as_dict(self):
        return asdict(self)


# Candidates per P bucket, ordered by preference (fastest first); the dispatcher takes the first that fits.
CONFIGS = {
    # P ≤ 16: 32-row tiles. With 64 rows, the [BM, 16] value/output tiles at 8 warps are miscompiled by Triton 3.6
    # on Hopper (H200: the output kernel faults in fp32 and returns wrong values in bf16, so does the dv kernel;
    # at 4 warps the output kernel is right; the interpreter runs the 64-row tiles exactly); 32 rows are right.
    # 4 warps: H200, bf16, B=8, T=4096, P=16: forward / forward+backward 9.96 / 60.9 ms at 8 warps, 4.56 / 33.1.
    # Every bucket's first configuration has the dq / dk kernels load the weighted dP the dv kernel stored
    # (``bwd_store_dpw``); H100, forty-second session, B=8, T=4096, forward+backward ms without → with it, bf16 /
    # fp32 inputs: P = 16 33.53 → 32.01 / 51.09 → 48.28, P = 32 28.87 → 28.79 / 65.46 → 50.82, P = 128 90.28 → 82.42
    # / 280.06 → 228.86 (``benchmarks/results/mimo_dpw_buckets_sweep.md``).
    # The blocks are bf16 for 16-bit inputs in every bucket (``dpw16``; timings in MimoConfig's docstring).
    # Every bucket's first configuration keeps the backward's state copies in bf16 for 16-bit inputs
    # (``bwd_states16``); H100 (fifty-fifth session), bf16, forward+backward ms off → on: B8 T4096 P = 16 24.63 →
    # 23.99, P = 32 27.62 → 27.05, P = 128 81.64 → 77.99; P = 64 (the chunked forward) B1 T32768 32.79 → 31.57, (the
    # scan) B8 T4096 26.96 → 25.23. The buckets' second configurations (other architectures') were not timed.
    # Register caps on sm_90 with 16-bit inputs (``fwd_out_maxnreg``, ``bwd_out_maxnreg``, ``state_maxnreg``): H100
    # (fifty-seventh session), bf16, B8 T4096, forward / forward+backward ms without → with each cap alone: P = 16
    # the output kernel at 128 in the forward 4.81 / 23.96 → 4.40 / 23.53, at 168 in its backward → 4.82 / 22.98;
    # P = 32 the chunk states at 168 5.05 / 26.43 → 4.84 / 25.88, the output kernel's backward at 168 → 5.06 / 25.81;
    # P = 128 the chunk states at 168 13.66 / 77.71 → 12.75 / 75.45. The same error numbers against float64.
    16: (MimoConfig(bm=32, warps=4, state_warps=4, warps_bwd=4, bwd_store_dpw=True, dpw16=True, bwd_states16=True,
                    fwd_out_maxnreg=128, bwd_out_maxnreg=168, name="bm32-w4"),),
    # P = 32: at 4 warps with 16-bit forward dots the output kernel returned wrong outputs and faulted on the H200
    # (Triton 3.6; the interpreter runs it exactly), so its forward dots stay tf32. H200, bf16, B=8, T=4096, P=32:
    # 8 warps with 16-bit forward dots 7.79 / 46.0 ms, 4 warps with tf32 ones 5.36 / 28.2.
    # fp32 inputs keep the 64-row tiles here: H100 (forty-third session), B8 T4096, forward+backward 50.63 ms against
    # 70.41 on 32-row tiles (``bm_fp32``) and 86.10 with a 16-row backward besides, though AOT predicted fewer spills.
    # The forward's output kernel capped at 168 registers on sm_90 (``fwd_out_maxnreg``): H100, B8 T4096 5.65 /
    # 26.94 → 5.07 / 26.35 ms.
    32: (MimoConfig(warps=4, state_warps=4, warps_bwd=4, fwd_dots16=False, bwd_store_dpw=True, dpw16=True,
                    bwd_states16=True, fwd_out_maxnreg=168, bwd_out_maxnreg=168, state_maxnreg=168,
                    name="bm64-w4-tf32"),),
    # P = 64 at 4 warps (two 4-warp CTAs per SM instead of one 8-warp CTA; 255 registers, ≤ 172 B spills on
    # sm_90): H200, bf16, B=8, T=4096: forward / forward+backward 9.22 / 56.6 ms at 8 warps, 6.08 / 35.0 ms.
    # The forward as the scan (``scan_fwd``) where the grid fills the GPU (``for_grid``); for 16-bit inputs the
    # backward's dots on 16-bit operands over 64-column N-pair blocks (``bwd_dots16``, ``bk_bwd16``); the dq / dk
    # kernels load the weighted dP the dv kernel stored (``bwd_store_dpw``: fp32 inputs 154.9 → 99.9 ms, H100),
    # kept in bf16 for 16-bit inputs (``dpw16``); fp32 inputs run 32-row tiles (``bm_fp32``: 99.3 → 86.4 ms).
    # The scan's walks at 4 warps (``scan_warps``; ``for_grid`` keeps 8 where the grid fills only one CTA per SM)
    # and the backward's state copies in bf16 (``bwd_states16``): H100 (fifty-fifth session), bf16, B8 T4096,
    # forward / forward+backward 4.83 / 28.37 ms at 8 warps with fp32 copies, 3.93 / 26.96 at 4 warps, 3.95 / 25.23
    # with both (peak memory 7.61 → 5.46 GB); the backward's states-only walk forming y for the output kernel's
    # backward (``bwd_walk_y``) 25.37 → 24.54 (peak 6.53 GB). The chunked forward's output kernel capped at 168
    # registers on sm_90 (``fwd_out_maxnreg``): H100 (fifty-sixth session), B1 T32768 6.64 / 31.47 → 6.03 / 30.91.
    64: (MimoConfig(warps=4, state_warps=4, warps_bwd=4, bwd_dots16=True, bk_bwd16=64, bwd_store_dpw=True,
                    dpw16=True, bm_fp32=32, scan_fwd=None, scan_bp=64, scan_warps=4, bwd_states16=True,
                    bwd_walk_y=True, fwd_out_maxnreg=168, name="bm64-w4"),
         MimoConfig(bm_bwd=32, warps_bwd=4, name="bm64-bwd32")),
    # P = 128 at 64 rows: with 16-bit forward dots the output kernel returned wrong values on the H200 (Triton 3.6:
    # output error 0.21 against float64, bf16, N = 64; every gradient right; the interpreter runs it exactly), so
    # this configuration keeps tf32 forward dots. Output and chunk-state kernels at 4 warps like P ≤ 64: H200, bf16,
    # B=8, T=4096, forward / forward+backward 21.35 / 101.4 ms at 8 warps, 13.34 / 85.0 at 4 (twelfth session).
    # fp32 inputs on 32-row tiles with a 16-row backward (``bm_fp32``, ``bm_bwd_fp32``: the dq / dk / dv kernels'
    # spills 2568 / 2268 / 3548 → 176 / 72 / 628 B, AOT sm_90): H100 (forty-third session), B8 T4096,
    # forward+backward 228.12 ms → 217.07 on 32-row tiles → 141.97 with the 16-row backward.
    128: (MimoConfig(bk=32, bm_bwd=32, warps=4, state_warps=4, warps_bwd=4, fwd_dots16=False, bwd_store_dpw=True,
                     dpw16=True, bm_fp32=32, bm_bwd_fp32=16, bwd_states16=True, state_maxnreg=168,
                     name="bm64-bk32-bwd32-w4"),
          MimoConfig(bm=32, bm_bwd=16, bk=16, bk_bwd=16, state_tiles=8, bp_state=32, warps=4, warps_bwd=4,
                     state_warps=4, name="bm32-bwd16")),
}

@dataclass(frozen=True)
class MimoProblem:
    dstate: int
    headdim: int
    rank: int
    dtype: torch.dtype = torch.bfloat16


def block_p(headdim: int) -> int:
    bp = 16
    while bp < headdim:
        bp *= 2
    return bp


def scan_block_p(cfg: MimoConfig, headdim: int, norm: bool) -> int:
    """The P block of ``mimo_scan_out_kernel``: ``cfg.scan_bp`` (at most the P bucket), all of P with the fused
    RMSNorm or when scan_bp is 0."""
    bp = block_p(headdim)
    return bp if norm or not cfg.scan_bp else min(cfg.scan_bp, bp)


#: The scan forward's last wave must be this full (programs / (waves × SMs)) for it to run: at one CTA per SM its
#: time is waves × one sequence's walk, while the chunked forward's follows the tokens. On the H200 the scan took
#: 0.85 (B8 T4096: 256 programs on 132 SMs) and 0.87 (B4 T8192: 128) of the chunked forward's time with the last
#: wave 0.97 full, so by that measure a wave 0.83-0.84 full would tie; 0.9 leaves a margin (no fill between was
#: measured).
SCAN_MIN_FILL = 0.9


def scan_ctas_per_sm(cfg: MimoConfig) -> int:
    """How many ``mimo_scan_out_kernel`` programs an SM holds at once: its 64 K registers divided by one program's
    (255 registers per thread, allocated as 256, at 4 and 8 warps: AOT sm_90 bf16 P block 64) — 1 at 8 warps, 2 at
    4."""
    return max(1, 65536 // (256 * 32 * cfg.scan_warps))


def scan_walk_warps(cfg: MimoConfig) -> tuple[int, ...]:
    """The warp counts :func:`for_grid` may run the scan's walks at, in the order it tries them: the configured
    ``scan_warps``, then 8 (one CTA per SM)."""
    return tuple(dict.fromkeys((cfg.scan_warps, 8)))


def for_grid(cfg: MimoConfig, *, programs: int, sm_count: int | None, rank: int, dstate: int, sixteen_bit: bool,
             equal_lengths: bool) -> MimoConfig:
    """``cfg`` with ``scan_fwd`` decided: as set when True or False; None (the dispatcher's) gives
    :meth:`MimoConfig.scan_variant` where what was measured says it pays — 16-bit inputs (fp32 ones spill 6-31 KB
    per thread off sm_90, AOT), R = 4 at 16-token chunks and N/2 ≤ bk (the H200's sweep shape; other R and chunks
    were not timed), sequences of one length (the longest would set the scan's time) and ``programs`` (P blocks ×
    sequences × heads) filling the last wave of a device of known SM count to ``SCAN_MIN_FILL`` (a wave: as many
    programs as :func:`scan_ctas_per_sm` lets the SMs hold) at ``cfg.scan_warps``, else at 8 warps (one CTA per
    SM). The scan kernel's shared memory (≤ 50 KB for 16-bit inputs) is proven by the AOT lane on every CI
    architecture."""
    if cfg.scan_fwd is not None:
        return cfg
    pays = sixteen_bit and rank == 4 and cfg.bm == 64 and dstate // 2 <= cfg.bk and equal_lengths and bool(sm_count)
    if pays:
        for warps in scan_walk_warps(cfg):
            walk = replace(cfg, scan_warps=warps)
            slots = sm_count * scan_ctas_per_sm(walk)
            if programs >= SCAN_MIN_FILL * -(-programs // slots) * slots:
                return walk.scan_variant()
    return replace(cfg, scan_fwd=False)


def output_launch_options(arch: int, bp: int, fp32_inputs: bool, y_io: int, cap: int = 0) -> dict:
    """Launch options of ``mimo_out_kernel`` on compute capability ``arch`` (BP ``bp``; ``y_io`` as the kernel's
    Y_IO: 0 y computed, 1 the forward stores it, 2 the epilogue backward reads it): an explicit ``maxnreg=255``
    where the ptxas of Triton 3.6 otherwise drops into its spill-everything allocation, nothing elsewhere. AOT, N =
    128, registers / spill-store bytes per thread without → with the cap (every ``aot_launches`` entry compiled for
    every CI architecture; ``tests/aot/test_register_spills.py`` fails on a new one):

    - sm_100, fp32 inputs, BP = 32 (the dispatcher's P = 32 bucket there), the kernels that compute y: forward 56 /
      8368 → 255 / 2520 (8508 → 2520 when it stores y), epilogue backward 56 / 9536 → 255 / 2528. The backward
      that reads y (152 / 0) and the 16-bit kernels (222-226 / 0) do not collapse, and the cap only moves them
      (152 → 202), so they go without it.
    - sm_80, 16-bit inputs, BP = 128, the epilogue backward that reads y: 32 / 5676 → 255 / 908. The same PTX gets
      255 registers on sm_86. The cap leaves every other BP = 128 output kernel on sm_80 as it was, but raises
      the registers of the smaller buckets' backward that reads y without spills to remove (P = 32: 140-147 →
      204-206), so it goes no further.

    (The SISO gradient kernels' cap on sm_80 is ``siso.configs.gradient_launch_options``.) Untimed: no A100 or
    B200 is lent; a 32-56-register allocation with 5-9.5 KB of spills per thread is what the cap removes.
    Elsewhere ``register_cap``'s ``cap`` (``MimoConfig.output_maxnreg``)."""
    collapses = ((arch == 100 and bp == 32 and fp32_inputs and y_io != 2)
                 or (arch == 80 and bp == 128 and not fp32_inputs and y_io == 2))
    return {"maxnreg": 255} if collapses else register_cap(arch, fp32_inputs, cap)


def register_cap(arch: int, fp32_inputs: bool, cap: int) -> dict:
    """A configuration's register cap (``MimoConfig.fwd_out_maxnreg``, ``bwd_out_maxnreg``, ``state_maxnreg``) as a
    launch option where it applies: sm_90 with 16-bit inputs, where the caps were chosen and timed."""
    return {"maxnreg": cap} if cap and arch == 90 and not fp32_inputs else {}


def smem_estimates(cfg: MimoConfig, headdim: int) -> dict[str, int]:
    """Upper bounds (bytes) of each tile kernel's shared memory: every fp32 dot operand of the kernel counted
    once, without the reuse Triton's allocator does (measured values are 40–70 % of these; the AOT lane
    checks the real ones). Where 16-bit inputs run the backward on other tiles (``bk_bwd16``), its kernels are
    counted for them too, at 2 bytes per operand (``[16-bit]``)."""
    bm, bk, bp = cfg.bm, cfg.bk, block_p(headdim)
    bps = min(cfg.bp_state, bp)
    est = {
        # scores [BM,BK]·[BK,BM], value [BM,BM]·[BM,BP], state [BM,BK]·[BK,BP]
        "mimo_out_kernel": 4 * (2 * bm * bk + bm * bm + bm * bp + bm * bk + bk * bp),
        # [BP,BM]·[BM,BK]
        "mimo_chunk_state_kernel": 4 * (bps * bm + bm * bk),
        **_bwd_operands(cfg.bm_bwd, cfg.bk_bwd, cfg.dv_block, bp, 4, 4, ""),
        "mimo_state_bwd_kernel": 1024,
    }
    cfg16 = cfg.for_dtype(torch.bfloat16)
    if (cfg16.bk_bwd, cfg16.dv_block) != (cfg.bk_bwd, cfg.dv_block):
        est.update(_bwd_operands(cfg16.bm_bwd, cfg16.bk_bwd, cfg16.dv_block, bp, 2 if cfg.bwd16_dqk else 4, 2,
                                 "[16-bit]"))
    return est


def _bwd_operands(bb: int, bk_dqk: int, bk_dv: int, bp: int, size_dqk: int, size_dv: int,
                  tag: str) -> dict[str, int]:
    return {
        # dP [BB,BP]·[BP,BB], state [BB,BP]·[BP,BK], (W∘dP) [BB,BB]·[BB,BK]
        f"mimo_bwd_dqk_kernel{tag}": size_dqk * (2 * bb * bp + bp * bb + bp * bk_dqk + bb * bb + bb * bk_dqk),
        # state [BB,BK]·[BK,BP], scores [BB,BK]·[BK,BB], dP [BB,BP]·[BP,BB], value [BB,BB]·[BB,BP]
        f"mimo_bwd_dv_kernel{tag}": size_dv * (bb * bk_dv + bk_dv * bp + 2 * bb * bk_dv + 2 * bb * bp + bb * bb
                                               + bb * bp),
    }


def smem_estimate(cfg: MimoConfig, headdim: int) -> int:
    """The largest of :func:`smem_estimates`."""
    return max(smem_estimates(cfg, headdim).values())


def choose_config(spec, problem: MimoProblem) -> MimoConfig:
    """The first configuration of ``CONFIGS[P bucket]`` whose footprint fits ``spec.smem_optin`` (no
    autotuning). The caller's chunk_size only caps the tile afterwards (``MimoConfig.for_chunk``), which can
    only shrink the footprint. Raises RuntimeError naming the limit and the need when nothing fits."""
    if problem.dstate not in SUPPORTED_N or problem.rank not in SUPPORTED_R or problem.headdim > 128:
        raise ValueError(f"MIMO Triton kernels support N in {SUPPORTED_N}, P ≤ 128, R in {SUPPORTED_R}; "
                         f"got N={problem.dstate}, P={problem.headdim}, R={problem.rank}")
    bucket = block_p(problem.headdim)
    need = []
    for cfg in CONFIGS[bucket]:
        b = smem_estimate(cfg, problem.headdim)
        need.append((cfg.name, b))
        if b <= spec.smem_optin:
            return cfg
    raise RuntimeError(f"no MIMO kernel configuration fits {spec.name}: its shared-memory limit is "
                       f"{spec.smem_optin} B per block; P={problem.headdim} needs "
                       + ", ".join(f"{n}: {b} B" for n, b in need))


def describe(spec) -> list[dict]:
    """What the dispatcher would run on ``spec`` for each P bucket (the choice does not depend on N/R/dtype)."""
    rows = []
    for p in P_BUCKETS:
        cfg = choose_config(spec, MimoProblem(dstate=128, headdim=p, rank=4))
        for kern, est in smem_estimates(cfg, p).items():
            rows.append({"kernel": kern, "config": cfg.as_dict(), "problem": {"headdim_bucket": p},
                         "smem_bound": est})
    return rows


def aot_launches(arch: int):
    """Every (kernel, configuration, dtype class, shape class) the dispatcher can choose on ``arch``.

    The footprint grows with BP only (never with N, T, B or R), so each chosen configuration is compiled at
    the largest P bucket that selects it. Dtype classes: fp32 inputs (tf32x3 dots) and 16-bit inputs (tf32
    dots on fp32 operands; bf16 and fp16 only differ in their loads). Shape classes: N/2 ≤ BK (the rotated
    tile is reused, ``ONE_K``) at N = 128 and, where the configuration's BK allows it, N/2 > BK at N = 256.
    The state-passing and angle kernels use no dots (shared memory only for reduction / scan scratch) and are
    listed once (the angle kernels at A = 32 and A = 128, their two block shapes' extremes). A configuration
    whose scan forward the launcher may pick (``scan_fwd`` None) adds that kernel for 16-bit inputs (the only ones
    ``for_grid`` picks it for; at the configured warps and at 8), with the backward's state-pass scans and its dv / dq
    / dk kernels (``bwd_store_dpw``).
    Each configuration's output kernels (and scan forward) once more with ``save_y``, which any caller may turn on
    (``mamba3_mimo(save_y=True)``).
    """
    from mamba3.dispatch import arch_spec

    from .launch import aot_kernel_launches

    spec = arch_spec(arch)
    chosen = {}
    for p in P_BUCKETS:
        cfg = choose_config(spec, MimoProblem(dstate=128, headdim=p, rank=4))
        chosen[cfg] = max(chosen.get(cfg, 0), p)
    tiles = ("mimo_chunk_state", "mimo_out", "mimo_bwd")
    launches = []
    for i, (cfg, p) in enumerate(chosen.items()):
        for dtype in (torch.float32, torch.bfloat16):
            launches += aot_kernel_launches(cfg, headdim=p, dtype=dtype, arch=arch, kernels=tiles)
        if cfg.bk >= 64 or cfg.bk_bwd >= 64:  # the N/2 > BK loops at N = 256
            launches += aot_kernel_launches(cfg, headdim=p, dtype=torch.bfloat16, arch=arch, dstate=256,
                                            kernels=("mimo_out", "mimo_bwd_dv"))
        saving = replace(cfg, save_y=True, name=f"{cfg.name}-savey")
        for dtype in (torch.float32, torch.bfloat16):
            launches += aot_kernel_launches(saving, headdim=p, dtype=dtype, arch=arch, kernels=("mimo_out",))
        if cfg.scan_fwd is None:  # the scan forward at every walk for_grid may pick, with (once: they do not
            # depend on the walk's warps) the backward's state-pass scans and stored dP blocks
            for i, warps in enumerate(scan_walk_warps(cfg)):
                kernels = ("mimo_scan_out", "mimo_state_scan_bwd", "mimo_bwd") if i == 0 else ("mimo_scan_out",)
                launches += aot_kernel_launches(replace(cfg, scan_warps=warps).scan_variant(), headdim=p,
                                                dtype=torch.bfloat16, arch=arch, kernels=kernels)
                launches += [x for x in aot_kernel_launches(replace(saving, scan_warps=warps).scan_variant(),
                                                            headdim=p, dtype=torch.bfloat16, arch=arch,
                                                            kernels=("mimo_scan_out",))
                             if "-states]" not in x.name]
        if cfg.bwd_states16:  # the chunked reverse pass's bf16 dS copies and bf16 S (the fp32 one: below)
            launches += aot_kernel_launches(cfg, headdim=p, dtype=torch.bfloat16, arch=arch,
                                            kernels=("mimo_state_bwd",))
        if i == 0:
            launches += aot_kernel_launches(cfg, headdim=p, dtype=torch.float32, arch=arch,
                                            kernels=("mimo_state", "mimo_angle"))
            launches += aot_kernel_launches(cfg, headdim=p, dtype=torch.float32, arch=arch, dstate=512,
                                            kernels=("mimo_angle",))  # A = 128: the largest angle block
    return launches
