"""MIMO Triton kernels on a real GPU against the float64 reference: every feature, dtype and configuration.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_mimo.py -x -q
"""
import json
import hashlib
from pathlib import Path

import pytest
import torch

from mamba3.testing.inputs import mimo_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mimo_seed"


def _check(dtype, chunk_size=16, config=None, **kw):
    from mamba3.ops.mimo.check import assert_within_contract, compare

    args = mimo_inputs(dtype=dtype, device="cuda", **kw)
    errs = compare(args, chunk_size=chunk_size, config=config)
    assert_within_contract(errs, dtype)
    return errs


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", [
    dict(),                                                               # D, Z, φ (mimo_out)
    dict(rms_norm=True, states=True),                                     # fused norm, input states
    dict(with_out=False, with_z=False, with_D=False),                     # per-rank output, plain
    dict(with_out=False, rms_norm=True),                                  # per-rank output with norm and gate
    dict(shared_angles=True, nangles=16),                                 # A = N/2, angles shared by heads
], ids=["dzout", "norm-states", "perrank-plain", "perrank-norm", "shared-angles-rd2"])
@pytest.mark.parametrize("headdim", [32, 64])
def test_features(dtype, case, headdim):
    """Each P bucket has its own configuration (warps, 16-bit forward dots), and Triton 3.6's Hopper miscompiles
    seen so far were specific to a P bucket: every feature at P = 32 and at the benchmarks' P = 64."""
    _check(dtype, bsz=2, seqlen=100, nheads=4, ngroups=2, dstate=32, headdim=headdim, rank=4, **case)


@pytest.mark.parametrize("seqlen,chunk", [(1, 16), (17, 16), (16, 16), (33, 8), (300, 16)])
def test_lengths(seqlen, chunk):
    """Any T ≥ 1 (not a multiple of the chunk: the official backward refuses T=17 with chunk 16)."""
    _check(torch.float32, chunk_size=chunk, bsz=2, seqlen=seqlen, nheads=2, ngroups=1, dstate=64, headdim=32,
           rank=4, states=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_varlen(dtype):
    _check(dtype, bsz=1, seqlen=211, nheads=4, ngroups=1, dstate=64, headdim=64, rank=2, states=True,
           rms_norm=True, cu_seqlens=[0, 1, 17, 90, 211])


@pytest.mark.parametrize("dstate,headdim", [(16, 16), (32, 128), (64, 32), (128, 64), (256, 128), (256, 16)])
def test_shapes(dstate, headdim):
    """Every N and every P bucket (N only changes masks and whether N/2 fits one pair block)."""
    _check(torch.float32, bsz=1, seqlen=70, nheads=2, ngroups=1, dstate=dstate, headdim=headdim, rank=2,
           states=True)


@pytest.mark.parametrize("rank", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ranks(rank, dtype):
    _check(dtype, bsz=2, seqlen=77, nheads=4, ngroups=4, dstate=64, headdim=64, rank=rank, rms_norm=True,
           states=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_strong_decay_with_ragged_tiles(dtype):
    """adt = −12 per token (the in-chunk log-decay cumsum passes −88 within a tile) with ragged tiles at every
    sequence end, as packed varlen training meets them: the kernels used to give NaN gradients here (an absent
    token's decay against a valid one was e^{+|c|} = inf) and an fp32 d_adt off by 1e-3 to 8e-3 (cancelling γ
    terms); see tests/interp/test_mimo_kernels.py::test_strong_decay_with_ragged_tiles."""
    from mamba3.ops.mimo.check import assert_within_contract, compare

    args = mimo_inputs(dtype=dtype, device="cuda", bsz=1, seqlen=211, nheads=4, ngroups=1, dstate=64, headdim=64,
                       rank=4, states=True, rms_norm=True, cu_seqlens=[0, 1, 17, 90, 211])
    args["adt"] = torch.full_like(args["adt"], -12.0)
    errs = compare(args, chunk_size=16)
    bad = sorted(k for k, e in errs.items() if not e == e)
    assert not bad, f"non-finite: {bad}"
    assert_within_contract(errs, dtype)


def test_fp32_n128_p64_r4():
    """The seed's worst case on 99 KB GPUs: fp32 at N=128, P=64, R=4 (the official kernel needs ≈400 KB)."""
    _check(torch.float32, bsz=1, seqlen=130, nheads=2, ngroups=1, dstate=128, headdim=64, rank=4, states=True,
           rms_norm=True)


def _all_configs():
    from mamba3.ops.mimo.configs import CONFIGS

    seen = []
    for p, cfgs in CONFIGS.items():
        for cfg in cfgs:
            seen.append((p, cfg))
    return seen


@pytest.mark.parametrize("p,cfg", _all_configs(), ids=lambda x: str(x) if isinstance(x, int) else x.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_config(p, cfg, dtype):
    """Every configuration any architecture may select, at its P bucket, with every feature on."""
    _check(dtype, config=cfg, bsz=2, seqlen=150, nheads=4, ngroups=2, dstate=64, headdim=p, rank=4, states=True,
           rms_norm=True)


def _scan_variants():
    from mamba3.ops.mimo.configs import CONFIGS
    from mamba3.testing.mimo_variants import applies, with_variant

    scans = [cfg.scan_variant() for cfgs in CONFIGS.values() for cfg in cfgs if cfg.scan_fwd is None]
    # and the scan forward with the backward's chunked state passes (scan_states, scan_dstates off), and with its
    # operands broadcast per token / rank (scan_gather off), with the walks at 8 warps (for_grid's fallback), with
    # the output kernel's backward forming y again instead of the states-only walk (bwd_walk_y off), and with the
    # walk's y in bf16 (save_y16; bf16 inputs only, the others keep fp32), and with the reverse state walk on
    # 32-column N-pair blocks at 128 registers (dstates_bk, dstates_maxnreg)
    tags = ("chunked-passes", "bcast", "walk8", "ycalc", "walky16", "dsb32r128")
    return scans + [with_variant(c, tag) for tag in tags for c in scans if applies(tag, c)]


@pytest.mark.parametrize("cfg", _scan_variants(), ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", [
    dict(bsz=2, seqlen=150, rms_norm=True),                               # fused norm: all of P in one block
    dict(bsz=1, seqlen=211, cu_seqlens=[0, 1, 17, 90, 211]),              # varlen
    dict(bsz=2, seqlen=100, with_out=False),                              # per-rank output
], ids=["norm", "varlen", "perrank"])
def test_scan_forward(cfg, dtype, case):
    """The scan forward of every configuration the dispatcher may switch to it (``MimoConfig.scan_variant``; forced
    here, at any grid and dtype), with the backward's state passes as scans (``scan_states``, ``scan_dstates``) and
    chunked, at the benchmarks' N = 128 and P = 64, input states and every feature on, against float64."""
    _check(dtype, config=cfg, nheads=4, ngroups=2, dstate=128, headdim=64, rank=4, states=True, **case)


def _every_config_with(*tags):
    """(P bucket, configuration) of every configuration with each variant of ``mamba3.testing.mimo_variants`` on
    where it applies: the scan forward (as B8 T4096 runs it) and the chunked one (two token tiles per state chunk)
    where the dispatcher may pick either."""
    from mamba3.testing.mimo_variants import every_config_with

    return every_config_with(*tags)


def _check_candidate(p, cfg, dtype):
    _check(dtype, config=cfg, bsz=1, seqlen=211, cu_seqlens=[0, 1, 17, 90, 211], nheads=4, ngroups=2, dstate=128,
           headdim=p, rank=4, states=True, rms_norm=True)


@pytest.mark.parametrize("p,cfg", _every_config_with("savey"),
                         ids=lambda x: str(x) if isinstance(x, int) else x.name)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_save_y(p, cfg, dtype):
    """``MimoConfig.save_y`` (``mamba3_mimo(save_y=True)``: y kept from the forward for the epilogue's backward) on
    every configuration, at the benchmarks' N = 128, packed sequences, input states, GQA, every feature on, against
    float64."""
    _check_candidate(p, cfg, dtype)


@pytest.mark.parametrize("p,cfg", _every_config_with("savey16"),
                         ids=lambda x: str(x) if isinstance(x, int) else x.name)
def test_save_y16(p, cfg):
    """``MimoConfig.save_y16`` (y kept in bf16 for bf16 inputs; not on by default) on every configuration, as
    :func:`test_save_y`, bf16 only (other inputs keep y in fp32)."""
    _check_candidate(p, cfg, torch.bfloat16)


@pytest.mark.parametrize("p,cfg", _every_config_with("dqk64w8"), ids=lambda x: str(x) if isinstance(x, int) else x.name)
def test_dqk_tiles_sm90(p, cfg):
    """``MimoConfig.bk_dqk90`` / ``warps_dqk90`` (the dq / dk kernels on 64-column N-pair blocks at 8 warps, for
    16-bit inputs on sm_90: the H100 and H200 this suite runs on) on every configuration, as :func:`test_save_y`,
    bf16 (fp32 inputs keep the configured tiles)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the tiles apply on sm_90 only")
    _check_candidate(p, cfg, torch.bfloat16)


@pytest.mark.parametrize("p,cfg", _every_config_with("dpw", "dpw-dqk16", "dpw16"),
                         ids=lambda x: str(x) if isinstance(x, int) else x.name)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_bwd_store_dpw(p, cfg, dtype):
    """``MimoConfig.bwd_store_dpw`` (the dq / dk kernels load the weighted dP the dv kernel stored; on in the scan
    variant and P = 64's configuration) on every configuration, as :func:`test_save_y`, with 16-bit dq / dk dots
    (``bwd16_dqk``: the blocks stored in 16 bits), and with the blocks in bf16 for tf32 dq / dk dots (``dpw16``)."""
    _check_candidate(p, cfg, dtype)


@pytest.mark.parametrize("p,cfg", _every_config_with("states16"),
                         ids=lambda x: str(x) if isinstance(x, int) else x.name)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_bwd_states16(p, cfg, dtype):
    """``MimoConfig.bwd_states16`` (the backward's copies of S and dS in bf16 for 16-bit inputs) on every
    configuration, as :func:`test_save_y`."""
    _check_candidate(p, cfg, dtype)


@pytest.mark.parametrize("p,cfg", _every_config_with("fp32rows", "fp32rows-bwd64", "fp32rows-bwd16"),
                         ids=lambda x: str(x) if isinstance(x, int) else x.name)
def test_fp32_tile_rows(p, cfg):
    """``MimoConfig.bm_fp32`` (fp32 inputs on 32-row tiles, the state chunk as long; on in the P = 64 and P = 128
    configurations) on every chunked configuration with larger tiles, the backward's tile capped to 32 rows, and at
    64 or 16 (``bm_bwd_fp32``; 16 on in P = 128's), as :func:`test_save_y`, fp32 inputs (the only ones it changes)."""
    _check_candidate(p, cfg, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_dispatcher_scans_filling_grids(dtype, monkeypatch):
    """Without a forced configuration: a grid of (sequence, head) programs that fills every SM runs the scan
    forward (``configs.for_grid``), and it matches float64; one sequence of the same tokens does not."""
    from mamba3.ops.mimo import launch
    from mamba3.testing.calls import count_calls

    calls = count_calls(monkeypatch, launch, "scan_forward")["scan_forward"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    _check(dtype, bsz=sms, seqlen=40, nheads=2, ngroups=1, dstate=128, headdim=64, rank=4, states=True)
    scans = len(calls)
    assert scans >= 1
    _check(dtype, bsz=1, seqlen=40, nheads=2, ngroups=1, dstate=128, headdim=64, rank=4, states=True)
    assert len(calls) == scans


def _bwd16_params():
    # H200, fifteenth session: with 16-bit backward dots the 64-row, 4-warp configurations (P = 32 and 64) return
    # a wrong dq (d_q 0.8-1.3 relative; d_adt, d_angles, the input angle state with it), while the interpreter runs
    # the same configuration within 4.6e-3 and the 32-row (P = 16) and P = 128 ones pass on the H200: a suspected
    # Triton 3.6 Hopper miscompile like the forward's at P = 32. Strict, so that a fix shows up here. (Loading
    # the dq kernel's dy tile as [CT, R, BP] reshaped to rows, which skips the fp32 shared-memory staging these
    # configurations have, did not fix them: still wrong on the H200 in the seventeenth session, reverted.)
    # On 64-column N-pair blocks (bk_bwd16 = 64) P = 64 is right (the default from the twenty-sixth session; since
    # the twenty-eighth the dq / dk kernels keep tf32 dots there, bwd16_dqk off) and P = 32 returns a wrong dv on
    # the H200 (d_v 75 relative, d_adt, d_trap, d_mimo_v with it; dq right).
    # Since the dq kernel loads the weighted dP the dv kernel stored (``bwd_store_dpw``, on in every bucket since the
    # forty-second session) instead of forming it, P = 32 passed on an H100 in three runs of three (forty-third
    # session, bf16 and fp16; not yet run on an H200), so it is no longer marked. P = 64's dq stayed wrong there in
    # bf16 (three runs of three) and in fp16 in one run of three: a miscompile whose effect comes and goes, so that
    # mark is not strict (neither result is a change to act on; a strict mark would fail at random).
    import dataclasses

    from mamba3.testing.mimo_variants import OPT_IN

    wrong_dq = {"bm64-w4"}
    wrong_dv_bk64 = {"bm64-w4-tf32"}
    params = []
    for p, cfg in _all_configs():
        cfg32 = dataclasses.replace(cfg, **OPT_IN["bwd16"])  # every kernel 16-bit
        marks = ([pytest.mark.xfail(strict=False, reason="wrong dq on the H200 and H100, not in every run")]
                 if cfg.name in wrong_dq else [])
        params.append(pytest.param(p, cfg32, marks=marks, id=f"{p}-{cfg.name}"))
        if cfg.name in wrong_dq | wrong_dv_bk64:  # also on 64-column N-pair blocks
            marks = ([pytest.mark.xfail(strict=True, reason="wrong dv on the H200")] if cfg.name in wrong_dv_bk64
                     else [])
            params.append(pytest.param(p, dataclasses.replace(cfg, **OPT_IN["bwd16-bk64"]), marks=marks,
                                       id=f"{p}-{cfg.name}-bk64"))
        if cfg.bwd_dots16:  # as chosen (P = 64: the dv kernel alone on 16-bit dots, on 64-column blocks)
            params.append(pytest.param(p, cfg, id=f"{p}-{cfg.name}-chosen"))
    return params


@pytest.mark.parametrize("p,cfg", _bwd16_params())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_config_with_16bit_backward_dots(p, cfg, dtype):
    """``bwd_dots16`` (on by default for P = 64 only, with ``bk_bwd16``) on every configuration: Triton 3.6's Hopper
    miscompiles so far were specific to a P bucket and a dot type, so each bucket runs it, with every feature on, at
    the benchmarks' N = 128 (two N-pair blocks in the dq/dk kernels)."""
    _check(dtype, config=cfg, bsz=2, seqlen=150, nheads=4, ngroups=2, dstate=128, headdim=p, rank=4, states=True,
           rms_norm=True)


def test_dispatcher_fits_device():
    from mamba3.dispatch import device_spec
    from mamba3.ops.mimo.configs import MimoProblem, choose_config, smem_estimate

    spec = device_spec()
    for p in (16, 32, 64, 128):
        cfg = choose_config(spec, MimoProblem(128, p, 4))
        assert smem_estimate(cfg, p) <= spec.smem_optin


def test_new_length_does_not_recompile():
    """A new T or batch size never recompiles (the official MIMO compiles three kernels per new shape)."""
    from mamba3.ops.common import cumsum
    from mamba3.ops.common.state_passing import state_passing_kernel
    from mamba3.ops.mimo import bwd, fwd
    from mamba3.ops.mimo.check import call
    from mamba3.ops.mimo.function import mimo_triton

    kernels = [fwd.mimo_chunk_state_kernel, state_passing_kernel, fwd.mimo_out_kernel,
               bwd.mimo_state_bwd_kernel, bwd.mimo_bwd_dqk_kernel, bwd.mimo_bwd_dv_kernel,
               cumsum.chunk_sums_kernel, cumsum.rotation_kernel, cumsum.angle_totals_kernel, cumsum.angle_bwd_kernel,
               cumsum.chunk_prefix_kernel]

    def count():
        return sum(len(k.device_caches[d][0]) for k in kernels for d in list(k.device_caches))

    def run(bsz, seqlen):
        args = mimo_inputs(dtype=torch.bfloat16, device="cuda", bsz=bsz, seqlen=seqlen, nheads=2, ngroups=1,
                           dstate=32, headdim=32, rank=4, states=True)
        args["input_states"] = tuple(s.requires_grad_(True) for s in args["input_states"])
        args["v"].requires_grad_(True)
        out, finals = call(mimo_triton, args, chunk_size=16, precision="ieee")
        (out.float().sum() + sum(f.float().sum() for f in finals)).backward()
        torch.cuda.synchronize()

    run(2, 64)
    before = count()
    for bsz, seqlen in ((3, 50), (1, 1000), (5, 17), (1, 1)):
        run(bsz, seqlen)
    assert count() == before, "a new T or batch size recompiled a MIMO kernel"


def test_precision_does_not_compound_with_T():
    """fp32 output error at T = 65,536 stays within 2× of the error at T = 256 (same per-token statistics), as SISO's
    (the angles' float64 prefix over chunks and the per-chunk state passing must not lose precision with T)."""
    from mamba3.ops.mimo.check import call
    from mamba3.ops.mimo.function import mimo_triton
    from mamba3.reference import mimo_chunked
    from mamba3.testing.errors import rel_frobenius
    from mamba3.testing.inputs import float64_copy

    errs = {}
    for bsz, seqlen in ((16, 256), (1, 65536)):
        args = mimo_inputs(dtype=torch.float32, device="cuda", bsz=bsz, seqlen=seqlen, nheads=1, ngroups=1,
                           dstate=64, headdim=64, rank=4, with_D=True, with_z=True)
        with torch.no_grad():
            out = call(mimo_triton, args, chunk_size=16, precision="ieee")[0]
            ref = call(mimo_chunked, float64_copy(args), chunk_size=16)[0]
        errs[seqlen] = rel_frobenius(out, ref)
    assert errs[65536] <= 2 * errs[256], f"error grows with T: T=256 {errs[256]:.2e}, T=65536 {errs[65536]:.2e}"
    assert errs[65536] <= 1e-5, f"T=65536 error {errs[65536]:.2e} > 1e-5"
    print(f"T=256 {errs[256]:.2e}  T=65536 {errs[65536]:.2e}")


def test_seed_fixture_kernels():
    """The seed report's boundary tensors (B=1, T=17, H=16, N=64, P=32, R=4, chunk 16, fp32): the kernels
    reproduce the stored float64 reference output and gradients within the fp32 bar."""
    from mamba3.ops.mimo.check import kernel
    from mamba3.testing.errors import rel_frobenius

    data = torch.load(FIXTURE / "mimo_seed.pt")
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    for name, t in data["inputs"].items():
        assert hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest() == manifest["sha256"][f"inputs/{name}"]
    args = {k: v.cuda() for k, v in data["inputs"].items()}
    args["norm_eps"] = 1e-5
    out, finals, grads = kernel(args, [data["upstream"]["out"]], chunk_size=16)
    assert rel_frobenius(out, data["expected"]["out"]) <= 1e-5
    for name, g in data["expected_grads"].items():
        assert rel_frobenius(grads[name], g) <= 1e-4, name
