"""Device capabilities, the architecture table, backend choice and the registry of ops.

Nothing here queries a GPU at import time: `device_spec()` asks CUDA when it is called, and the per-op
configuration modules are imported only when someone asks for them (`op_configs`).

Protocol of an op's configuration module (``OPS[name]``, e.g. ``mamba3.ops.siso.configs``):

``aot_launches(arch: int) -> list[mamba3.testing.aot.KernelLaunch]``
    Every (kernel, configuration, dtype, problem class) the dispatcher can choose on compute capability
    ``arch`` (e.g. 89), with representative launch arguments (CPU tensors with the dtypes and 16-byte
    alignment of a real call, sizes/strides as the real call would pass them, constexprs and
    num_warps/num_stages in ``meta``). The AOT test lane and ``python -m mamba3 info --arch sm_XX`` compile
    each of them for ``arch`` and check ``shared + static_shared <= OPTIN_SMEM[arch]``.

``describe(spec: DeviceSpec) -> list[dict]``
    One dict per kernel the dispatcher would run on that device: at least ``"kernel"`` (name), ``"config"``
    (the chosen configuration as a JSON-serialisable dict) and ``"problem"`` (the problem class, e.g. dtype /
    head-dim bucket). Must not launch anything; it only runs the choice logic.

A module that does not exist yet means "no Triton kernels yet" for that op (`op_configs` returns None);
a module that exists but fails to import is a bug and the error propagates.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass

# Opt-in maximum dynamic shared memory per block (bytes), by compute capability major*10+minor
# (CUDA programming guide, "Features and Technical Specifications"). 121 (GB10) is known but is not in the CI
# matrix; 122 must never be compiled (Triton's LLVM aborts the whole process).
OPTIN_SMEM: dict[int, int] = {
    80: 166_912,
    86: 101_376,
    89: 101_376,
    90: 232_448,
    100: 232_448,
    120: 101_376,
    121: 101_376,
}

# Architectures the AOT lane compiles every kernel configuration for.
CI_ARCHS: tuple[int, ...] = (80, 86, 89, 90, 100, 120)

# Op name -> its configuration module (imported lazily, see the module docstring for the protocol).
OPS: dict[str, str] = {
    "siso": "mamba3.ops.siso.configs",
    "mimo": "mamba3.ops.mimo.configs",
    "step": "mamba3.ops.step.configs",
    "rms_norm": "mamba3.ops.rms_norm.configs",
}


@dataclass(frozen=True)
class DeviceSpec:
    """What the dispatcher needs to know about a device (a real GPU or an architecture on paper)."""

    name: str
    arch: int  # compute capability as major*10 + minor, e.g. 90
    smem_optin: int  # bytes of shared memory a block may opt into
    sm_count: int | None = None  # None when unknown (an architecture without a concrete device)


def parse_arch(value: str | int) -> int:
    """Parse ``"sm_89"``, ``"89"``, ``"sm_90a"``, ``"8.9"`` or ``89`` into an int compute capability."""
    if isinstance(value, int):
        return value
    s = str(value).strip().lower()
    m = re.fullmatch(r"(?:sm_?|compute_)?(\d+)(?:\.(\d))?a?", s)
    if not m:
        raise ValueError(f"cannot parse architecture {value!r}; expected e.g. 'sm_89', '89' or 'sm_90a'")
    if m.group(2) is not None:  # "8.9"
        return int(m.group(1)) * 10 + int(m.group(2))
    return int(m.group(1))


def arch_spec(arch: str | int) -> DeviceSpec:
    """A DeviceSpec for an architecture without a device (``python -m mamba3 info --arch``, the AOT lane)."""
    cc = parse_arch(arch)
    if cc not in OPTIN_SMEM:
        known = ", ".join(f"sm_{a}" for a in sorted(OPTIN_SMEM))
        raise ValueError(f"unknown architecture sm_{cc}; known: {known}")
    return DeviceSpec(name=f"sm_{cc}", arch=cc, smem_optin=OPTIN_SMEM[cc], sm_count=None)


def _device_index(device) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device_spec needs a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _device_spec_by_index(index: int) -> DeviceSpec:
    import torch

    p = torch.cuda.get_device_properties(index)
    return DeviceSpec(
        name=p.name,
        arch=p.major * 10 + p.minor,
        smem_optin=int(p.shared_memory_per_block_optin),
        sm_count=int(p.multi_processor_count),
    )


def device_spec(device=None) -> DeviceSpec:
    """The DeviceSpec of a CUDA device (None = the current one), read from CUDA at call time, cached per index."""
    return _device_spec_by_index(_device_index(device))


def op_configs(name: str):
    """The configuration module of op ``name`` (see OPS), or None if it does not exist yet."""
    modname = OPS[name]
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        # Only "this module (or a parent package) does not exist" means "no kernels yet";
        # a missing import *inside* an existing configs module is a bug and must surface.
        parts = modname.split(".")
        missing = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if e.name in missing:
            return None
        raise


def backend_for(tensor) -> str:
    """Which backend ``backend="auto"`` picks for a tensor: Triton on CUDA, the PyTorch reference otherwise."""
    return "triton" if tensor.is_cuda else "reference"
