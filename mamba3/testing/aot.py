"""Ahead-of-time compilation of Triton kernels for a given NVIDIA architecture, on a machine without a GPU.

Used by the AOT test lane (tests/aot) and by ``python -m mamba3 info --arch sm_XX`` to get the shared-memory
bytes (and registers, spills) of exactly the binaries the JIT would produce at launch.

Why not just ``triton.compile`` with a hand-written signature: the JIT specializes arguments (16-byte
alignment / divisibility hints, integer arguments equal to 1 become constexprs). Without that, bf16 loads are
never pipelined and the shared-memory numbers are wrong. We therefore run Triton's own binder
(``create_function_from_signature``) and ``JITFunction._pack_args`` on the launch arguments. Both are private
API (present in triton 3.6.0 and 3.7.1 with the same signatures): re-check them when the pin changes;
``tests/aot/test_aot_selftest.py`` fails if the specialization is lost.

Triton never raises OutOfResources at compile time (only at the first launch), so the budget check is ours:
``shared + static_shared <= OPTIN_SMEM[arch]``, where static_shared is the cubin's static ``.nv.shared``
section reported by the bundled cuobjdump (1 KiB on sm_90+), counted conservatively.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from mamba3.dispatch import CI_ARCHS, OPTIN_SMEM

__all__ = ["KernelLaunch", "AotResult", "compile_launch", "trace_launch", "OPTIN_SMEM", "CI_ARCHS", "fits"]


@dataclass
class KernelLaunch:
    """One kernel launch as the host code would make it.

    name:   a readable id (kernel name + config + dtype/problem class), used in test ids and messages.
    kernel: the ``@triton.jit`` function (``@triton.autotune`` / ``@triton.heuristics`` wrappers are accepted:
            heuristics are evaluated on the arguments, an autotuner's own configs are ignored: pass the chosen
            config's constexprs and num_warps/num_stages in ``meta``).
    args:   positional arguments as at launch: CPU tensors (only dtype and data_ptr() % 16 matter), ints,
            floats, None. Use the sizes and strides a real call passes (multiples of 16, unit strides = 1).
    meta:   constexpr keyword arguments plus launch options (num_warps, num_stages, ...).
    """

    name: str
    kernel: Any
    args: tuple
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AotResult:
    name: str
    arch: int
    shared: int  # dynamic shared memory Triton requests at launch (metadata.shared), bytes
    static_shared: int  # static shared memory in the cubin (cuobjdump SHARED:), bytes
    n_regs: int | None  # registers per thread (cuobjdump REG:)
    n_spills: int | None  # spill-store bytes from the ptxas -v log (None unless compile_launch(..., spills=True))
    local: int | None = None  # local memory per thread (cuobjdump LOCAL:), bytes
    # stack frame per thread (cuobjdump STACK:), bytes: where ptxas puts spilled registers. Not the spill stores'
    # bytes: slots are reused (the collapsed kernels' frames are 0.37-0.69 of them) and the frame is padded (up to
    # 128 B more than the stores; AOT, SISO defaults and MIMO on sm_80 / 90 / 120)
    stack: int | None = None
    ttgir: str | None = None  # the TritonGPU IR (layouts), with compile_launch(..., ir=True)
    sass: str | None = None  # cuobjdump -sass of the cubin, with compile_launch(..., sass=True)
    # nvdisasm --print-line-info of the cubin (each instruction under its source file and line), with
    # compile_launch(..., lines=True); read with mamba3.testing.sass.source_lines
    sass_lines: str | None = None

    @property
    def total_shared(self) -> int:
        return self.shared + self.static_shared


def fits(result: AotResult) -> bool:
    """Whether the compiled kernel fits its architecture's opt-in shared-memory limit."""
    return result.total_shared <= OPTIN_SMEM[result.arch]


def _unwrap(kernel, args: tuple, meta: dict):
    """Strip autotune/heuristics wrappers down to the JITFunction, evaluating heuristics like Heuristics.run."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    meta = dict(meta)
    while not isinstance(kernel, JITFunction):
        if isinstance(kernel, Heuristics):
            for key, fn in kernel.values.items():
                meta[key] = fn({**dict(zip(kernel.arg_names, args)), **meta})
            kernel = kernel.fn
        elif isinstance(kernel, Autotuner):
            kernel = kernel.fn
        else:
            hint = ""
            if type(kernel).__name__ == "InterpretedFunction":
                hint = (" (it was defined with TRITON_INTERPRET=1; AOT compilation needs a process without the "
                        "interpreter: run tests/aot separately from tests/interp)")
            raise TypeError(f"expected a @triton.jit function, got {type(kernel).__name__}{hint}")
    return kernel, meta


def _cubin_tool(cubin: bytes, option: str, tool: str = "cuobjdump") -> str:
    """``tool`` (Triton's bundled cuobjdump or nvdisasm) run with ``option`` on the cubin."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        return subprocess.run([getattr(knobs.nvidia, tool).path, option, path], check=True, capture_output=True,
                              text=True).stdout
    finally:
        os.unlink(path)


def _cuobjdump_resources(cubin: bytes) -> dict[str, int]:
    out = _cubin_tool(cubin, "--dump-resource-usage")
    res = {}
    for key in ("REG", "SHARED", "LOCAL", "STACK"):
        m = re.search(rf"\b{key}:(\d+)", out)
        if m:
            res[key] = int(m.group(1))
    if "SHARED" not in res:
        raise RuntimeError(f"could not read SHARED: from cuobjdump --dump-resource-usage output:\n{out}")
    return res


def _ptxas_spill_stores(ptx: str, arch: int, options) -> int:
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", src,
               "-o", os.path.join(d, "k.cubin")]
        if not getattr(options, "enable_fp_fusion", True):
            cmd.insert(1, "--fmad=false")
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    stores = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    return max(stores) if stores else 0


def _bind(launch: KernelLaunch, arch: int):
    """(ASTSource, target, backend, options) of ``launch`` on ``arch``, as JITFunction.run forms them."""
    if arch not in OPTIN_SMEM:
        # Unknown targets (e.g. 122) make Triton's LLVM abort the whole process: refuse them here.
        known = ", ".join(str(a) for a in sorted(OPTIN_SMEM))
        raise ValueError(f"refusing to compile for unknown architecture {arch}; known: {known}")

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel, meta = _unwrap(launch.kernel, tuple(launch.args), launch.meta)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    # Same two steps as JITFunction.run: bind + specialize, then pack into (options, signature, constexprs, attrs).
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*launch.args, **meta)
    options, signature, constexprs, attrs = kernel._pack_args(backend, options, bound_args, specialization,
                                                              options)
    return ASTSource(kernel, signature, constexprs, attrs), target, backend, options


def trace_launch(launch: KernelLaunch, arch: int) -> None:
    """Run only the front end of the compile of ``launch`` for ``arch`` (Python → Triton IR, well under a second
    where the whole compile takes many): it raises the ``CompilationError`` a launch would (a type error, returns
    of two dtypes, a bad constexpr branch), none of which ``TRITON_INTERPRET=1`` notices. It checks no resource."""
    from triton._C.libtriton import ir

    source, target, backend, options = _bind(launch, arch)
    options = backend.parse_options(dict(options.__dict__, **source.parse_options()))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)


def compile_launch(launch: KernelLaunch, arch: int, *, spills: bool = False, ir: bool = False,
                   sass: bool = False, lines: bool = False) -> AotResult:
    """Compile ``launch`` for compute capability ``arch`` exactly as the JIT would, without a GPU.

    ``spills=True`` re-runs ptxas -v on the PTX to count spill-store bytes (about one more ptxas run);
    ``ir=True`` keeps the TritonGPU IR (``AotResult.ttgir``); ``sass=True`` the disassembly
    (``AotResult.sass``, read with :mod:`mamba3.testing.sass`); ``lines=True`` the disassembly with each
    instruction's source line (``AotResult.sass_lines``, read with :func:`mamba3.testing.sass.source_lines`).
    Compiled kernels go to Triton's cache (TRITON_CACHE_DIR), so repeating a compile is cheap.
    """
    import triton

    source, target, _, options = _bind(launch, arch)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    res = _cuobjdump_resources(compiled.asm["cubin"])
    n_spills = _ptxas_spill_stores(compiled.asm["ptx"], arch, options) if spills else None
    return AotResult(
        name=launch.name,
        arch=arch,
        shared=int(compiled.metadata.shared),
        static_shared=res["SHARED"],
        n_regs=res.get("REG"),
        n_spills=n_spills,
        local=res.get("LOCAL"),
        stack=res.get("STACK"),
        ttgir=compiled.asm["ttgir"] if ir else None,
        sass=_cubin_tool(compiled.asm["cubin"], "-sass") if sass else None,
        sass_lines=_cubin_tool(compiled.asm["cubin"], "--print-line-info", "nvdisasm") if lines else None,
    )
