"""The MIMO configuration variants a caller or a test may switch on beside the dispatcher's choices, in one place.

The GPU tests run each variant on every configuration it applies to (``tests/gpu/test_mimo.py``) and the AOT lane
traces the same variants' kernels through Triton's front end (``tests/aot/test_kernel_variants_trace.py``), so a
variant added for one is covered by the other.
"""
from __future__ import annotations

import dataclasses

import torch

# tag: the MimoConfig fields the variant sets
OPT_IN = {
    "savey": dict(save_y=True),
    "savey16": dict(save_y=True, save_y16=True),
    "dpw": dict(bwd_store_dpw=True),
    "dpw-dqk16": dict(bwd_store_dpw=True, bwd16_dqk=True),
    "dpw16": dict(bwd_store_dpw=True, dpw16=True),
    "nodpw": dict(bwd_store_dpw=False),
    "fp32rows": dict(bm_fp32=32, bm_bwd_fp32=0),  # the backward capped to the forward's rows
    "fp32rows-bwd64": dict(bm_fp32=32, bm_bwd_fp32=64),
    "fp32rows-bwd16": dict(bm_fp32=32, bm_bwd_fp32=16),
    "bwd16": dict(bwd_dots16=True, bk_bwd16=0, bwd16_dqk=True),
    "bwd16-bk64": dict(bwd_dots16=True, bk_bwd16=64, bwd16_dqk=True),
    "bwd16-dv": dict(bwd_dots16=True, bk_bwd16=64, bwd16_dqk=False),
    "chunked-passes": dict(scan_states=False, scan_dstates=False),
    "bcast": dict(scan_gather=False),
    "walk8": dict(scan_warps=8),
    "states16": dict(bwd_states16=True),
    "ycalc": dict(bwd_walk_y=False),  # the output kernel's backward forms y again
    "walky16": dict(save_y16=True),  # bwd_walk_y's buffer in bf16 (for bf16 inputs)
    "dqk64w8": dict(bk_dqk90=64, warps_dqk90=8),  # the dq / dk kernels on 64-column blocks at 8 warps (sm_90)
    "dsb32r128": dict(dstates_bk=32, dstates_maxnreg=128),  # the reverse state walk on 32-column blocks, capped
}


def base_configs() -> list:
    """(P bucket, configuration) of every configuration the dispatcher may run: each bucket's candidates, and
    where the dispatcher picks the forward from the grid (``scan_fwd`` None) the scan variant first, then the
    chunked one."""
    from mamba3.ops.mimo.configs import CONFIGS

    return [(p, c) for p, cfgs in CONFIGS.items() for cfg in cfgs
            for c in ((cfg.scan_variant(), cfg) if cfg.scan_fwd is None else (cfg,))]


def applies(tag: str, cfg) -> bool:
    """Whether the variant changes anything on ``cfg``: nothing where its fields are already set; the scan
    forward's own switches only with the scan forward (the backward's y switches only where its states-only walk
    runs, and that walk's y dtype only where it forms y); 32-row fp32 tiles only on the chunked forward's longer
    tiles, with rows the configuration accepts (``MimoConfig.for_dtype`` refuses the others); 16-bit dq / dk blocks
    only where the backward's dots are 16-bit."""
    flags = OPT_IN[tag]
    if all(getattr(cfg, field) == value for field, value in flags.items()):
        return False
    if tag in ("chunked-passes", "bcast", "walk8"):
        return bool(cfg.scan_fwd)
    if tag == "ycalc":
        return bool(cfg.scan_fwd and cfg.scan_states)
    if tag == "dsb32r128":
        return bool(cfg.scan_fwd and cfg.scan_dstates)
    if tag == "walky16":
        return bool(cfg.scan_fwd and cfg.scan_states and cfg.bwd_walk_y)
    if "bm_fp32" in flags:
        if cfg.scan_fwd or cfg.bm <= flags["bm_fp32"]:
            return False
        try:
            with_variant(cfg, tag).for_dtype(torch.float32)
        except ValueError:
            return False
        return True
    if tag == "dpw-dqk16":
        return cfg.bwd_dots16
    return True


def with_variant(cfg, tag: str):
    """``cfg`` with the variant's fields set, named ``{cfg.name}-{tag}``."""
    return dataclasses.replace(cfg, **OPT_IN[tag], name=f"{cfg.name}-{tag}")


def every_config_with(*tags: str) -> list:
    """(P bucket, configuration) for each tag in turn and every base configuration it applies to."""
    return [(p, with_variant(c, tag)) for tag in tags for p, c in base_configs() if applies(tag, c)]
