"""The AOT lane's view of SISO: every kernel launch the dispatcher can make on an architecture.

We run the real host code (forward and backward, every optional input present so every kernel and flag
appears) on small CPU tensors with launches *recorded* instead of run (``common.launch.recording``) and with the
device spec replaced by the architecture's. So the AOT lane compiles exactly what a user's GPU would, with the
same constexprs, warps, stages and argument specialisation.

Problem classes compiled per arch: N = P = 128 at the dispatcher's chunk for bf16 (the 16-bit-dot path; fp16 has
the same footprint) and fp32 (the fp32-operand path on halves), fp32 at an explicit chunk 64 (the largest
fp32-path footprint), fp32 with N = 16 (fp32 operands on one interleaved 16-wide block) and bf16 with N = 32 (16-bit
inputs on the fp32-operand path). Why this bounds every shape: no tile grows with N or P
(the kernels loop or grid over blocks of bn and bp, which depend only on the path), every tile is C×bn, C×bp,
bp×bn or C×C, and each path's largest chunk is compiled. The four light kernels (chunk sums, rotation
planes, state passing, angle backward) have tiny dtype-independent tiles and are compiled once (state passing once
per kind: in place in fp32, into a 16-bit copy, and the reverse pass with its ⟨dSe, S⟩ partials). The scan
of ``SisoConfig.scan_states`` (the launcher's choice for large 16-bit grids on a device of known SM count, which an
AOT target is not; forced for fp32) is compiled on the dispatcher's N = P = 128 tiles for bf16 and fp32 (its other
kernels are the default ones, deduplicated), with ``SisoConfig.states16`` and ``bwd_states16`` (the defaults): the
bf16 forward's scan and output kernel then take a 16-bit state buffer, the backward's recompute the fp32 one, and
the reverse scan forms its ⟨dSe, S⟩ partials and 16-bit copies of S and dS for the per-chunk gradient kernels (on
the chunk-parallel path ``state_passing`` does both).
``SisoConfig.bwd_store_a1`` and ``bwd_store_a1_fp32`` (the defaults: bwd_dv hands M∘(dY Vᵀ) to bwd_dqk) act with one
P block only, so bf16 at N = 128, P = 64 is a class of its own (the dispatcher's choice there), and so is fp32 at
P = the fp32 path's bp on the architecture (64 on sm_90, 32 elsewhere). The stride-2 pair tiles of
``SisoConfig.contiguous_halves=False`` are compiled on that fp32 class, chunk-parallel and on the scan, and for bf16
at N = 32 (names end in ``-strided``). On the fp32-operand path at P > bp the hand-over goes as per-P-block shares
(``SisoConfig.bwd_store_a1_blocks``, names ending in ``-a1blocks``: fp32 at P = 128, and bf16 at N = 32, which runs
on fp32 operands); with the flag off bwd_dqk forms M∘(dY Vᵀ) itself, compiled for fp32 at P = 128. The reverse
pass of ``mamba3_siso(save_states=True)`` (on the forward's 16-bit states, nothing copied; names ending ``-kept``) is
compiled for bf16 chunk-parallel and on the scan, and the scan with ``SisoConfig.scan_prefetch`` 2 in all three
walks for bf16 (names ending ``-prefetch2``; the default forward walk's too).
"""
from __future__ import annotations

import torch

from mamba3.dispatch import arch_spec
from mamba3.testing.aot import KernelLaunch

from ..common.launch import recording
from . import function as F
from .configs import SisoProblem


_SCAN = dict(scan_states=True, states16=True)


def _problem_classes(spec, default_only: bool = False):
    """(input dtype, explicit chunk or None, N, config changes[, P = 128]); default_only: only the dispatcher's own
    choices (the changes force the scan on the dispatcher's tiles, N = P = 128: an architecture's spec has no SM
    count, so the launcher's own rule, ``function._scan_states``, records the chunked path). One P block (P = bp):
    the backward's hand-over of M∘(dY Vᵀ) on 16-bit dots (``bwd_store_a1``) and as one share on fp32 operands
    (``bwd_store_a1_fp32``; P = 128 hands several, ``bwd_store_a1_blocks``)."""
    fp32_bp = F.choose_config(spec, SisoProblem("fp32", 128, 128)).bp
    yield torch.bfloat16, None, 128, {}
    yield torch.float32, None, 128, {}
    yield torch.bfloat16, None, 128, {}, 64
    yield torch.float32, None, 128, {}, fp32_bp
    if not default_only:
        yield torch.float32, 64, 128, {}
        yield torch.bfloat16, None, 128, _SCAN
        yield torch.float32, None, 128, _SCAN
        # SisoConfig.contiguous_halves off (the fp32-operand path's pair tiles by stride-2 loads and stores): fp32
        # chunk-parallel and on the scan, 16-bit inputs on fp32 operands
        yield torch.float32, None, 128, dict(contiguous_halves=False), fp32_bp
        yield torch.float32, None, 128, dict(_SCAN, contiguous_halves=False), fp32_bp
        yield torch.bfloat16, None, 32, dict(contiguous_halves=False)
        # SisoConfig.bwd_store_a1_blocks off: at P = 128 (several P blocks) bwd_dqk forms M∘(dY Vᵀ) itself
        yield torch.float32, None, 128, dict(bwd_store_a1_blocks=False)
        # mamba3_siso(save_states=True) (a call argument, not a config field): the reverse pass on the forward's
        # 16-bit states, chunk-parallel and on the scan
        yield torch.bfloat16, None, 128, dict(save_states=True)
        yield torch.bfloat16, None, 128, dict(_SCAN, save_states=True)
        # SisoConfig.scan_prefetch 2 in every walk (the default, compiled above, has it in the forward walk only; 0
        # carries less than either)
        yield torch.bfloat16, None, 128, dict(_SCAN, scan_prefetch=(2, 2, 2))
    yield torch.float32, None, 16, {}
    yield torch.bfloat16, None, 32, {}


_LIGHT = ("chunk_sums_kernel", "rotation_kernel", "state_passing_kernel", "angle_totals_kernel", "angle_bwd_kernel",
          "decay_grad_kernel", "trap_grad_kernel", "chunk_prefix_kernel")


def _record(spec, dtype, chunk, dstate, changes, headdim=128):
    import dataclasses

    from mamba3.testing.inputs import siso_inputs

    changes = dict(changes)
    save_states = changes.pop("save_states", False)
    args = siso_inputs(bsz=2, seqlen=256, nheads=2, ngroups=1, dstate=dstate, headdim=headdim,
                       nangles=min(32, dstate // 2), dtype=dtype, states=True, with_D=True, with_z=True)
    leaves = []
    for name in ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "angles", "D", "z"):
        args[name].requires_grad_(True)
        leaves.append(args[name])
    states = tuple(s.detach().requires_grad_(True) for s in args["input_states"])
    prev, prev_cfg = F._SPEC_OVERRIDE, F._CONFIG_OVERRIDE
    F._SPEC_OVERRIDE = spec
    if changes:
        F._CONFIG_OVERRIDE = dataclasses.replace(F.choose_config(spec, F.problem_for(args["q"], args["v"], chunk)),
                                                 **changes)
    try:
        with recording() as rec:
            out, fs = F.siso_triton(args["q"], args["k"], args["v"], args["adt"], args["dt"], args["trap"],
                                    args["q_bias"], args["k_bias"], args["angles"], args["D"], args["z"], states,
                                    chunk, None, "ieee", save_states=save_states)
            loss = out.float().sum() + sum(x.float().sum() for x in fs)
            loss.backward()
    finally:
        F._SPEC_OVERRIDE, F._CONFIG_OVERRIDE = prev, prev_cfg
    return rec


def aot_launches(arch: int, *, default_only: bool = False) -> list[KernelLaunch]:
    """default_only: leave out the problem classes with an explicit (caller-chosen) chunk size."""
    spec = arch_spec(arch)
    out, seen = [], set()
    for problem in _problem_classes(spec, default_only):
        for kernel, grid, args, meta in _record(spec, *problem):
            sig = tuple(str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)
            key = (kernel.fn.__name__, tuple(sorted((k, str(v)) for k, v in meta.items())), sig)
            if kernel.fn.__name__ in _LIGHT:
                key = kernel.fn.__name__
            if key == "state_passing_kernel":  # the pass into its fp32 buffer, into a 16-bit copy, and with ⟨dSe, S⟩
                key = (key, str(args[5].dtype), meta["KEND"], meta["COPY_S"])
            if key in seen:
                continue
            seen.add(key)
            short = {k: v for k, v in meta.items()
                     if k in ("C", "BN", "BP", "MODE", "num_warps", "num_stages", "BLOCK")}
            tag = "-".join(f"{k}{v}" for k, v in short.items())
            name = f"{kernel.fn.__name__}-{str(problem[0]).replace('torch.', '')}-{tag}"
            if kernel.fn.__name__ == "state_passing_kernel":
                name += f"-out{str(args[5].dtype).replace('torch.', '')}" + ("-kend" if meta["KEND"] else "")
            if meta.get("KEND") and not meta.get("COPY_S", True):
                name += "-kept"
            if meta.get("PREFETCH", 1) != 1:
                name += f"-prefetch{meta['PREFETCH']}"
            if meta.get("STRIDED"):
                name += "-strided"
            if (meta.get("STORE_A1") or meta.get("LOAD_A1")) and meta["P"] > meta["BP"]:
                name += "-a1blocks"
            out.append(KernelLaunch(name=name, kernel=kernel, args=tuple(args), meta=dict(meta)))
    return out
