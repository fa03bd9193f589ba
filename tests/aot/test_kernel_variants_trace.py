"""Every MIMO kernel of every opt-in configuration variant passes Triton's front end (Python → Triton IR).

The interpreter lane runs the kernels' Python, where a type error of the compiled language goes unnoticed
(returns of two dtypes from one ``@triton.jit`` function, say), and the shared-memory lane compiles only the
configurations the dispatcher chooses. The variants a caller or a GPU test may switch on (``save_y``,
``bwd_store_dpw`` with its 16-bit blocks, 16-bit backward dots, ``bm_fp32``, the scan forward's options) were
so far compiled first on the GPU: the forty-second session's GPU run failed six tests that way (a
``load_pair_block`` that returned bf16 or fp32 by a constexpr branch). Tracing takes ≈ 0.1 s per kernel, so this
lane traces each distinct launch on sm_80 and sm_90 (the front end's dot checks depend on the architecture).
"""

import dataclasses
import os

import pytest
import torch

from mamba3.testing.aot import trace_launch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)

ARCHS = (80, 90)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# The opt-in switches, one at a time and as the GPU tests combine them (tests/gpu/test_mimo.py).
VARIANTS = {
    "savey": dict(save_y=True),
    "savey16": dict(save_y=True, save_y16=True),
    "dpw": dict(bwd_store_dpw=True),
    "dpw-dqk16": dict(bwd_store_dpw=True, bwd16_dqk=True),
    "dpw16": dict(bwd_store_dpw=True, dpw16=True),
    "nodpw": dict(bwd_store_dpw=False),
    "fp32rows": dict(bm_fp32=32),
    "fp32rows-bwd64": dict(bm_fp32=32, bm_bwd_fp32=64),
    "bwd16": dict(bwd_dots16=True, bk_bwd16=0, bwd16_dqk=True),
    "bwd16-bk64": dict(bwd_dots16=True, bk_bwd16=64, bwd16_dqk=True),
    "bwd16-dv": dict(bwd_dots16=True, bk_bwd16=64, bwd16_dqk=False),
    "chunked-passes": dict(scan_states=False, scan_dstates=False),
    "bcast": dict(scan_gather=False),
}


def _variants():
    from mamba3.ops.mimo.configs import CONFIGS

    out = []
    for p, cfgs in CONFIGS.items():
        for cfg in cfgs:
            for base in (cfg, cfg.scan_variant()) if cfg.scan_fwd is None else (cfg,):
                out.append(pytest.param(p, base, id=f"{p}-{base.name}"))
                for tag, flags in VARIANTS.items():
                    if tag in ("chunked-passes", "bcast") and not base.scan_fwd:
                        continue
                    if tag.startswith("fp32rows") and (base.scan_fwd or base.bm <= 32):
                        continue
                    variant = dataclasses.replace(base, **flags, name=f"{base.name}-{tag}")
                    out.append(pytest.param(p, variant, id=f"{p}-{variant.name}"))
    return out


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
