"""Every MIMO kernel of every opt-in configuration variant passes Triton's front end (Python → Triton IR).

The interpreter lane runs the kernels' Python, where a type error of the compiled language goes unnoticed
(returns of two dtypes from one ``@triton.jit`` function, say), and the shared-memory lane compiles only the
configurations the dispatcher chooses. The variants a caller or a GPU test may switch on (``save_y``,
``bwd_store_dpw`` with its 16-bit blocks, 16-bit backward dots, ``bm_fp32``, the scan forward's options) were
so far compiled first on the GPU: the forty-second session's GPU run failed six tests that way (a
``load_pair_block`` that returned bf16 or fp32 by a constexpr branch). Tracing takes ≈ 0.1 s per kernel, so this
lane traces each distinct launch on sm_80 and sm_90 (the front end's dot checks depend on the architecture).
"""

import os

import pytest
import torch

from mamba3.testing.aot import trace_launch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)

ARCHS = (80, 90)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _variants():
    """Every base configuration, then each opt-in variant of ``mamba3.testing.mimo_variants`` (the ones the GPU
    tests run) where it applies."""
    from mamba3.testing.mimo_variants import OPT_IN, base_configs, every_config_with

    return [pytest.param(p, cfg, id=f"{p}-{cfg.name}") for p, cfg in base_configs() + every_config_with(*OPT_IN)]


_traced: set = set()  # (arch, kernel, constexprs and argument dtypes) already traced in this process


def _key(arch, launch):
    meta = tuple(sorted((k, str(v)) for k, v in launch.meta.items()))
    args = tuple(str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__ for a in launch.args)
    return arch, id(launch.kernel), meta, args


@pytest.mark.parametrize("p,cfg", _variants())
def test_every_variant_traces(p, cfg):
    from mamba3.ops.mimo.launch import aot_kernel_launches

    failures = []
    for arch in ARCHS:
        for dtype in DTYPES:
            for dstate in (128, 256):
                for launch in aot_kernel_launches(cfg, headdim=p, dtype=dtype, arch=arch, dstate=dstate):
                    key = _key(arch, launch)
                    if key in _traced:
                        continue
                    try:
                        trace_launch(launch, arch)
                    except Exception as e:  # report every failing kernel of the variant, not only the first
                        last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
                        failures.append(f"sm_{arch} {launch.name}: {type(e).__name__}: {last}\n{e}")
                    else:
                        _traced.add(key)
    assert not failures, f"{len(failures)} kernel(s) of {cfg.name} fail Triton's front end:\n" + "\n\n".join(
        failures)
