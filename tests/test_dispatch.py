"""CPU tests of mamba3.dispatch and mamba3.testing.errors (no GPU, no Triton compile)."""

import dataclasses
import math

import pytest
import torch

from mamba3 import dispatch
from mamba3.testing import assert_rel_close, rel_frobenius


def test_parse_arch_and_arch_spec():
    assert ([dispatch.parse_arch(s) for s in ("sm_89", "89", "sm_90a", "SM_120", "8.6", 100)]
            == [89, 89, 90, 120, 86, 100])
    with pytest.raises(ValueError):
        dispatch.parse_arch("ampere")
    spec = dispatch.arch_spec("sm_86")
    assert spec == dispatch.DeviceSpec("sm_86", 86, 101_376, None)
    with pytest.raises(ValueError, match="sm_80, sm_86"):
        dispatch.arch_spec(122)
    assert set(dispatch.CI_ARCHS) <= set(dispatch.OPTIN_SMEM) and 122 not in dispatch.OPTIN_SMEM


def test_op_configs_missing_vs_broken(monkeypatch, tmp_path):
    monkeypatch.setitem(dispatch.OPS, "nothing", "mamba3.ops.does_not_exist.configs")
    assert dispatch.op_configs("nothing") is None
    (tmp_path / "mamba3_broken_configs.py").write_text("import mamba3_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(dispatch.OPS, "broken", "mamba3_broken_configs")
    with pytest.raises(ModuleNotFoundError, match="mamba3_no_such_dependency"):
        dispatch.op_configs("broken")  # an existing configs module that fails to import is a bug: surface it


def test_backend_for_cpu():
    assert dispatch.backend_for(torch.zeros(1)) == "reference"


def test_rel_frobenius():
    ref = torch.tensor([3.0, 4.0])
    assert rel_frobenius(ref, ref) == 0.0
    assert math.isclose(rel_frobenius(ref + torch.tensor([0.0, 0.5]), ref), 0.1)
    assert rel_frobenius(torch.tensor([1.0, 0.0]), torch.zeros(2)) == 1.0  # zero reference: absolute norm
    assert math.isnan(rel_frobenius(torch.tensor([float("nan"), 0.0]), ref))
    with pytest.raises(ValueError, match="shape"):
        rel_frobenius(torch.zeros(3), torch.zeros(2))


def test_assert_rel_close_message():
    ref = torch.ones(2, 3, dtype=torch.float64)
    assert assert_rel_close("ok", ref.float(), ref, 1e-6) == 0.0
    with pytest.raises(AssertionError) as e:
        assert_rel_close("dq", ref.float() * 1.1, ref, 1e-3)
    msg = str(e.value)
    for part in ("dq", "1.000e-01", "tol 1.0e-03", "(2, 3)", "torch.float32", "max abs error 1.000e-01"):
        assert part in msg, (part, msg)
    with pytest.raises(AssertionError):
        assert_rel_close("nan", torch.full((2,), float("nan")), torch.ones(2), 1.0)


def test_siso_16bit_dots_only_on_64x64_tiles():
    """16-bit SISO dots only where the H200 verified them (bn = bp = 64); narrower tiles take the fp32-operand path
    (tf32x3, on halves wherever they are ≥ 16 wide), and 8 backward warps only on tiles ≥ 32 wide (64×16 tiles at
    8 warps were miscompiled)."""
    from mamba3.dispatch import CI_ARCHS, arch_spec
    from mamba3.ops.siso.configs import SisoProblem, choose_config

    for arch in CI_ARCHS:
        for N in (16, 32, 64, 128, 256):
            for P in (16, 32, 64, 128):
                cfg = choose_config(arch_spec(arch), SisoProblem(dtype="bf16", dstate=N, headdim=P))
                assert cfg.half_dots == (N >= 64 and P >= 64), (arch, N, P, cfg)
                assert cfg.warps_bwd == 4 or (cfg.bn >= 32 and cfg.bp >= 32), (arch, N, P, cfg)
                assert cfg.half_dots or (cfg.fp32_prec == "tf32x3" and cfg.halves == (cfg.bn >= 32)), (arch, N, P, cfg)


def test_siso_head_split_follows_the_grid():
    """bwd_dqk's head split: the config's maximum (largest divisor of H/G) on small grids and without a device;
    the smallest divisor ≥ 2 that still gives every SM 8 programs on large ones (the H200's 132 SMs at B8 T4096
    H32: 512 chunks × 2 N blocks per split → 2 splits); 1 only where H/G has no other divisor."""
    from mamba3.ops.siso.function import _head_split

    assert _head_split(32, 8, 1024, 132) == 2
    assert _head_split(32, 8, 128, 132) == 8        # B1 T4096: 64 chunks × 2 N blocks per split
    assert _head_split(32, 8, 300, 132) == 4
    assert _head_split(32, 8, 1024, None) == 8      # no device (interpreter, an architecture on paper)
    assert _head_split(6, 8, 10_000, 132) == 2
    assert _head_split(7, 8, 10_000, 132) == 7      # divisors of 7: 1 and 7
    assert _head_split(1, 8, 10_000, 132) == 1
    assert _head_split(4, 1, 10_000, 132) == 1      # head_split = 1: dq/dk written directly


def test_mimo_scan_forward_only_on_filling_grids():
    """``MimoConfig.scan_fwd`` None: the scan forward where it was measured to pay (16-bit inputs, R = 4 at 16-token
    chunks, N ≤ 128, sequences of one length) and its programs fill the last wave of a known device; the chunked
    forward otherwise; True / False as set. A wave is one program per SM at 8 warps, two at 4; a grid that fills
    no 4-warp wave is tried at 8 warps."""
    from mamba3.dispatch import arch_spec
    from mamba3.ops.mimo.configs import CONFIGS, MimoConfig, MimoProblem, choose_config, for_grid, scan_ctas_per_sm

    base = choose_config(arch_spec(90), MimoProblem(128, 64, 4)).for_chunk(4, 16)
    assert base.scan_fwd is None and base.state_tiles == 2
    grid = dict(programs=256, sm_count=132, rank=4, dstate=128, sixteen_bit=True, equal_lengths=True)
    scan = for_grid(base, **grid)
    assert scan.scan_fwd is True and scan.state_tiles == 1 and scan.scan_bp == 64 and scan.scan_warps == 4
    assert scan.scan_states and scan.scan_dstates and scan.bwd_states16      # the backward's state passes too
    assert scan.bwd_walk_y                                                   # y formed in its states-only walk
    at_128 = for_grid(base, **dict(grid, programs=128))                      # 4 warps: 264 slots, half idle
    assert at_128.scan_fwd is True and at_128.scan_warps == 8                # 8 warps: one wave, 0.97 full
    for other in (dict(programs=200),                                        # second wave 0.52 full
                  dict(programs=64),                                         # half the SMs idle
                  dict(sm_count=None),                                       # no device
                  dict(sixteen_bit=False), dict(rank=2), dict(dstate=256), dict(equal_lengths=False)):
        cfg = for_grid(base, **dict(grid, **other))
        assert cfg.scan_fwd is False and cfg.state_tiles == 2, other
    assert for_grid(base.for_chunk(4, 8), **grid).scan_fwd is False          # 8-token chunks: not timed
    forced = MimoConfig(state_tiles=1, scan_fwd=True)
    assert for_grid(forced, **dict(grid, programs=1)) is forced
    off = MimoConfig(scan_fwd=False)
    assert for_grid(off, **grid) is off
    walk8 = dataclasses.replace(base, scan_warps=8)                        # one program per SM: 132 slots
    assert (scan_ctas_per_sm(base), scan_ctas_per_sm(walk8)) == (2, 1)
    assert for_grid(walk8, **grid).scan_warps == 8                           # two waves, 0.97 full
    assert all(cfg.scan_fwd is False for p, cfgs in CONFIGS.items() if p != 64 for cfg in cfgs)


def test_mimo_backward_tiles_follow_the_dtype():
    """``MimoConfig.bk_bwd16``: 16-bit inputs run the dv kernel's 16-bit dots on 64-column N-pair blocks and the dq /
    dk kernels' tf32 dots on 32 (``bwd16_dqk`` off; P = 64's configuration on every architecture); fp32 inputs keep
    32-column blocks (at 64 they spill 2-31 KB per thread), and so do 16-bit inputs where the backward's dots are
    tf32."""
    import dataclasses

    import torch

    from mamba3.dispatch import CI_ARCHS, arch_spec
    from mamba3.ops.mimo.configs import MimoConfig, MimoProblem, choose_config, smem_estimates

    for arch in CI_ARCHS:
        cfg = choose_config(arch_spec(arch), MimoProblem(128, 64, 4))
        assert cfg.bk_bwd == 32 and cfg.bwd_dots16 and cfg.bk_bwd16 == 64, arch
        fp32 = cfg.for_dtype(torch.float32)  # 32-row tiles (bm_fp32), the blocks as they were
        assert (fp32.bk_bwd, fp32.dv_block, fp32.bm, fp32.bm_bwd) == (32, 32, 32, 32), arch
        assert not cfg.bwd16_dqk, arch
        for dtype in (torch.bfloat16, torch.float16):
            assert (cfg.for_dtype(dtype).bk_bwd, cfg.for_dtype(dtype).dv_block) == (32, 64), (arch, dtype)
        assert "mimo_bwd_dv_kernel[16-bit]" in smem_estimates(cfg, 64)
    tf32 = dataclasses.replace(cfg, bwd_dots16=False)
    assert tf32.for_dtype(torch.bfloat16) is tf32 and "mimo_bwd_dv_kernel[16-bit]" not in smem_estimates(tf32, 64)
    assert MimoConfig(bwd_dots16=True).for_dtype(torch.bfloat16).bk_bwd == 32  # bk_bwd16 unset: bk_bwd


def test_mimo_fp32_tile_rows():
    """``MimoConfig.bm_fp32``: fp32 inputs run the chunked kernels on its rows, the backward's tile capped to them
    (or ``bm_bwd_fp32``'s, kept through ``for_chunk`` where the caller's chunk does not shorten the tile) and the
    state chunk as long as before; 16-bit inputs and the scan forward keep ``bm``; rows that do not divide the state
    chunk, and backward rows longer than it or not dividing it, are refused."""
    import dataclasses

    import pytest
    import torch

    from mamba3.ops.mimo.configs import MimoConfig

    cfg = MimoConfig(bm=64, bm_bwd=64, state_tiles=2, bm_fp32=32)
    fp32 = cfg.for_dtype(torch.float32)
    assert (fp32.bm, fp32.bm_bwd, fp32.state_tiles, fp32.bm_fp32) == (32, 32, 4, 0)
    long_bwd = dataclasses.replace(cfg, bm_bwd_fp32=64).for_dtype(torch.float32)
    assert (long_bwd.bm, long_bwd.bm_bwd, long_bwd.state_tiles, long_bwd.bm_bwd_fp32) == (32, 64, 4, 0)
    assert long_bwd.for_chunk(4, None) == long_bwd and long_bwd.for_chunk(4, 16) == long_bwd
    assert (long_bwd.for_chunk(4, 4).bm, long_bwd.for_chunk(4, 4).bm_bwd) == (16, 16)  # a shorter chunk caps both
    assert dataclasses.replace(cfg, bm_bwd_fp32=64).for_dtype(torch.bfloat16).bm_bwd == 64
    assert fp32.for_dtype(torch.float32) == fp32  # applied twice (the AOT lane's launches apply it again)
    for rank in (1, 2, 4):  # the state chunk's tokens are the same
        a, b = cfg.for_chunk(rank, None), fp32.for_chunk(rank, None)
        assert (a.bm // rank) * a.state_tiles == (b.bm // rank) * b.state_tiles, rank
    for dtype in (torch.bfloat16, torch.float16):
        assert cfg.for_dtype(dtype) == cfg, dtype
    assert cfg.scan_variant().for_dtype(torch.float32).bm == 64
    assert dataclasses.replace(cfg, bm_fp32=0).for_dtype(torch.float32).bm == 64
    with pytest.raises(ValueError, match="bm_fp32"):
        MimoConfig(bm=64, state_tiles=1, bm_fp32=48).for_dtype(torch.float32)
    for rows in (128, 48):  # longer than the state chunk, or not dividing it
        with pytest.raises(ValueError, match="bm_bwd_fp32"):
            MimoConfig(bm=64, bm_bwd=64, state_tiles=1, bm_fp32=32, bm_bwd_fp32=rows).for_dtype(torch.float32)


def test_mimo_dv_alone_on_16bit_dots():
    """``MimoConfig.bwd16_dqk`` off (the default): for 16-bit inputs the dv kernel takes 16-bit dots on ``bk_bwd16``
    blocks while the dq and dk kernels keep tf32 dots on ``bk_bwd`` blocks; fp32 inputs run both at ``bk_bwd``."""
    import dataclasses

    import torch

    from mamba3.ops.mimo.configs import MimoConfig, smem_estimates
    from mamba3.ops.mimo.launch import aot_kernel_launches, dot_precisions, dqk_precision

    cfg = MimoConfig(bk_bwd=32, bwd_dots16=True, bk_bwd16=64, bwd16_dqk=False)
    bf16 = cfg.for_dtype(torch.bfloat16)
    assert (bf16.bk_bwd, bf16.dv_block) == (32, 64)
    assert (cfg.for_dtype(torch.float32).bk_bwd, cfg.for_dtype(torch.float32).dv_block) == (32, 32)
    dot_prec, _fwd, bwd_prec = dot_precisions(torch.bfloat16, bf16)
    assert (dqk_precision(bf16, dot_prec, bwd_prec), bwd_prec) == ("tf32", "bf16")
    both = dataclasses.replace(cfg, bwd16_dqk=True)
    assert dqk_precision(both, dot_prec, bwd_prec) == "bf16" and both.for_dtype(torch.bfloat16).dv_block == 64
    est, est_both = smem_estimates(cfg, 64), smem_estimates(both, 64)
    # the 16-bit entries: dv at 2 bytes per operand on 64-column blocks in both; dq/dk at 4 bytes on 32 columns here
    assert est["mimo_bwd_dv_kernel[16-bit]"] == est_both["mimo_bwd_dv_kernel[16-bit]"]
    assert est["mimo_bwd_dqk_kernel[16-bit]"] == est["mimo_bwd_dqk_kernel"]
    metas = {x.name.split("-")[0]: x.meta for x in aot_kernel_launches(cfg, 64, torch.bfloat16, 90,
                                                                        kernels=("mimo_bwd",))}
    assert {k: (m["BK"], m["DOT_PREC"]) for k, m in metas.items()} == {
        "mimo_bwd_dqk_kernel[dq]": (32, "tf32"), "mimo_bwd_dqk_kernel[dk]": (32, "tf32"),
        "mimo_bwd_dv_kernel": (64, "bf16")}
