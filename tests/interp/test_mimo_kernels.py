"""MIMO Triton kernels under the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py), against the float64
reference: forward and backward (every input gradient, input states included, through a random upstream
gradient on the output and all four final states), fp32 and bf16, small shapes (N=16, P=16, R=2, T ∈ {1, 17}).

Each case launches every MIMO kernel (chunk states, state passing forward/backward, output, epilogue backward,
dq, dk, dv); the interpreter costs ~ms per program, so grids are kept tiny.
"""
import dataclasses

import pytest
import torch

from mamba3.testing.inputs import mimo_inputs

SMALL = dict(nheads=2, ngroups=1, dstate=16, headdim=16, rank=2)


def _check(dtype, chunk_size=8, config=None, **kw):
    from mamba3.ops.mimo.check import assert_within_contract, compare

    errs = compare(mimo_inputs(dtype=dtype, **kw), chunk_size=chunk_size, config=config)
    assert_within_contract(errs, dtype)
    print(", ".join(f"{k}={e:.2e}" for k, e in errs.items()))
    return errs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seqlen", [1, 17])
def test_all_features(dtype, seqlen):
    """D, Z, mimo_out, fused RMSNorm with weight, input states, final states; T=17 with chunk 8 (ragged)."""
    _check(dtype, bsz=2 if seqlen == 1 else 1, seqlen=seqlen, states=True, rms_norm=True, **SMALL)


def test_state_passing_across_chunks():
    """T=40 with 8-token tiles in state chunks of several tiles (the state-passing kernels run)."""
    _check(torch.float32, bsz=1, seqlen=40, states=True, **SMALL)


def test_varlen():
    _check(torch.float32, bsz=1, seqlen=26, states=True, cu_seqlens=[0, 1, 9, 26], **SMALL)


def test_gqa_per_rank_output_shared_angles():
    """Per-rank output (mimo_out=None) without z and D, two groups of two heads, A = N/2 shared angles."""
    _check(torch.float32, bsz=1, seqlen=17, nheads=4, ngroups=2, dstate=16, headdim=16, rank=2, nangles=8,
           shared_angles=True, with_out=False, with_z=False, with_D=False)


@pytest.mark.parametrize("rank,headdim", [(1, 24), (4, 16)])
def test_ranks(rank, headdim):
    _check(torch.float32, bsz=1, seqlen=17, nheads=2, ngroups=1, dstate=16, headdim=headdim, rank=rank,
           rms_norm=True)


def test_multi_block_n():
    """N/2 larger than the N-pair block (the looped path, ONE_K=False), several dq/dk programs per tile."""
    from mamba3.ops.mimo.configs import MimoConfig

    cfg = MimoConfig(bm=16, bm_bwd=16, bk=16, bk_bwd=16, state_tiles=2, bp_state=16, warps=4, warps_bwd=4,
                     state_warps=4, name="tiny")
    _check(torch.float32, config=cfg, bsz=1, seqlen=19, nheads=2, ngroups=1, dstate=64, headdim=16, rank=2,
           states=True, rms_norm=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_config(dtype):
    """Every configuration the dispatcher can select (at a P its bucket allows), on a tiny problem; bf16 runs both
    forward dot modes (16-bit operands where ``fwd_dots16``, tf32 elsewhere)."""
    from mamba3.ops.mimo.configs import CONFIGS

    seen = set()
    for p, cfgs in CONFIGS.items():
        for cfg in cfgs:
            key = dataclasses.replace(cfg, name="")
            if key in seen:
                continue
            seen.add(key)
            _check(dtype, config=cfg, chunk_size=None, bsz=1, seqlen=9, nheads=1, ngroups=1, dstate=16,
                   headdim=16, rank=4, states=True, rms_norm=True)


def test_dispatcher_error_names_limit():
    from mamba3.dispatch import CI_ARCHS, arch_spec
    from mamba3.ops.mimo.configs import MimoProblem, choose_config

    tiny = dataclasses.replace(arch_spec(89), smem_optin=16_000)
    with pytest.raises(RuntimeError, match="16000 B"):
        choose_config(tiny, MimoProblem(128, 64, 4))
    for arch in CI_ARCHS:
        for p in (16, 32, 64, 128):
            choose_config(arch_spec(arch), MimoProblem(128, p, 4))


def test_public_api_routes_to_kernels():
    """mamba3.mamba3_mimo(backend="triton") on CPU tensors runs these kernels under the interpreter."""
    import mamba3
    from mamba3.ops.mimo.check import TOLERANCES
    from mamba3.reference import mimo_recurrent
    from mamba3.testing.errors import assert_rel_close
    from mamba3.testing.inputs import float64_copy

    args = mimo_inputs(bsz=1, seqlen=5, states=True, **SMALL)
    out, states = mamba3.mamba3_mimo(**args, backend="triton", return_final_states=True)
    ref, ref_states = mimo_recurrent(**float64_copy(args))
    assert_rel_close("out", out, ref, TOLERANCES[torch.float32][0])
    for name, x, y in zip(("angle", "ssm", "k", "v"), states, ref_states):
        assert_rel_close(f"final {name}", x, y, TOLERANCES[torch.float32][0])


def test_public_api_save_y(monkeypatch):
    """mamba3.mamba3_mimo(save_y=True) keeps y in the forward (the dispatcher's configuration) and gives the same
    gradients as computing it again, to fp32 rounding."""
    import mamba3
    from mamba3.ops.mimo import launch
    from mamba3.testing.calls import count_calls
    from mamba3.testing.errors import assert_rel_close

    calls = count_calls(monkeypatch, launch, "new_ys")["new_ys"]
    args = mimo_inputs(bsz=1, seqlen=9, states=True, **SMALL)
    grads = []
    for save_y in (True, False):
        leaves = {k: x.detach().requires_grad_() for k, x in args.items() if isinstance(x, torch.Tensor)}
        out = mamba3.mamba3_mimo(**{**args, **leaves}, backend="triton", save_y=save_y)
        out.square().sum().backward()
        grads.append({k: x.grad for k, x in leaves.items()})
        assert len(calls) == 1
    for k in grads[1]:
        assert_rel_close(f"d_{k}", grads[0][k], grads[1][k], 1e-6)
    with torch.no_grad():  # nothing to keep y for
        mamba3.mamba3_mimo(**{**args, **leaves}, backend="triton", save_y=True)
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("dstate,bk_bwd16,bwd16_dqk", [(16, 0, True), (64, 0, True), (64, 32, True),
                                                       (64, 32, False)])
def test_16bit_backward_dots(dtype, dstate, bk_bwd16, bwd16_dqk):
    """``MimoConfig.bwd_dots16``: the backward's dots on 16-bit operands (q̃ / k̃ split in hi + lo in the dq / dk
    products; a bf16 dy where bf16 dots read it), every feature on; N = 64 with 16-column pair blocks runs the
    dq / dk kernels over several blocks and the dv kernel's looped path, with ``bk_bwd16`` = 32 one block; without
    ``bwd16_dqk`` the dq / dk kernels keep tf32 dots on their 16-column blocks beside the 16-bit dv on 32."""
    from mamba3.ops.mimo.configs import MimoConfig

    cfg = MimoConfig(bm=16, bm_bwd=16, bk=16, bk_bwd=16, state_tiles=2, bp_state=16, warps=4, warps_bwd=4,
                     state_warps=4, bwd_dots16=True, bk_bwd16=bk_bwd16, bwd16_dqk=bwd16_dqk, name="tiny-bwd16")
    _check(dtype, config=cfg, bsz=1, seqlen=19, nheads=2, ngroups=1, dstate=dstate, headdim=16, rank=2,
           states=True, rms_norm=True)


@pytest.mark.parametrize("seqlen,cu_seqlens", [(14, None), (19, [0, 5, 19])], ids=["ragged", "varlen"])
def test_strong_decay_with_ragged_tiles(seqlen, cu_seqlens):
    """adt = −12 per token, so the in-chunk log-decay cumsum passes −88 (e^c underflows fp32) within a tile, and the
    last tile of each state chunk is ragged (tokens past its end), as packed varlen training meets them once a model
    learns to forget fast. Two failures this pins: (1) the absent tokens read c = 0, so a pairwise decay between an
    absent and a valid token was e^{+|c|} = inf, and inf × the absent row's zero score = NaN, which the dk/dv
    contractions over query columns and the bias/φ sums over rows carried into valid gradients (d_k, d_v, d_q_bias,
    d_mimo_out, … all NaN); (2) d_adt formed as Σ q̃·dq̃ − Σ k̃·dk̃ cancels the same-token γ terms and the last
    token's own state term, leaving an fp32 residue above the decayed true value (1e-3 / 8e-3 relative). Both
    float64 references agree here to 1e-12 (at adt = −40 they differ by 7e-2 in d_adt themselves)."""
    from mamba3.ops.mimo.check import assert_within_contract, compare

    args = mimo_inputs(dtype=torch.float32, bsz=1, seqlen=seqlen, states=True, rms_norm=True,
                       cu_seqlens=cu_seqlens, **SMALL)
    args["adt"] = torch.full_like(args["adt"], -12.0)
    errs = compare(args, chunk_size=8)
    bad = sorted(k for k, e in errs.items() if not e == e)
    assert not bad, f"non-finite: {bad}"
    assert_within_contract(errs, torch.float32)


SCAN = dict(bm=16, bm_bwd=16, bk=16, bk_bwd=16, state_tiles=1, bp_state=16, warps=4, warps_bwd=4, state_warps=4,
            scan_fwd=True, scan_warps=4)


@pytest.fixture
def scan_calls(monkeypatch):
    """Counts the forwards that ran as the scan (so a test cannot pass on the chunked path by accident)."""
    from mamba3.ops.mimo import launch
    from mamba3.testing.calls import count_calls

    return count_calls(monkeypatch, launch, "scan_forward")["scan_forward"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_scan_forward_all_features(dtype, scan_calls):
    """``MimoConfig.scan_fwd``: the forward as one walk per (sequence, head) with the state in registers (then the
    chunked backward): D, z, φ, the fused RMSNorm with weight, input and final states, T = 19 in 8-token tiles
    (a ragged last tile), two sequences."""
    from mamba3.ops.mimo.configs import MimoConfig

    cfg = MimoConfig(**SCAN, name="tiny-scan")
    _check(dtype, config=cfg, bsz=2, seqlen=19, nheads=2, ngroups=1, dstate=32, headdim=16, rank=2, states=True,
           rms_norm=True)
    assert scan_calls


@pytest.mark.parametrize("with_out", [True, False], ids=["contracted", "per-rank"])
def test_scan_forward_p_blocks_varlen(with_out, scan_calls):
    """The scan forward over two P blocks (P = 24 in blocks of 16: the second one ragged), packed sequences of
    1, 13 and 3 tokens (programs idling through the longest sequence's extra chunks), input states, GQA."""
    from mamba3.ops.mimo.configs import MimoConfig

    cfg = MimoConfig(**SCAN, scan_bp=16, name="tiny-scan-bp16")
    _check(torch.float32, config=cfg, bsz=1, seqlen=17, nheads=4, ngroups=2, dstate=16, headdim=24, rank=2,
           states=True, cu_seqlens=[0, 1, 14, 17], with_out=with_out)
    assert scan_calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_scan_gather_is_bit_identical(dtype, scan_calls):
    """``MimoConfig.scan_gather`` (the default): the scan kernel's operands loaded per row are the values it
    otherwise loads per token or rank and broadcasts, so every error against float64 is the same number, in both
    walks (forward and the backward's states-only walk), over two P blocks, packed sequences, input states and
    GQA."""
    import dataclasses

    from mamba3.ops.mimo.configs import MimoConfig

    cfg = MimoConfig(**SCAN, scan_bp=16, scan_states=True, name="tiny-scan-bp16")
    kw = dict(bsz=1, seqlen=17, nheads=4, ngroups=2, dstate=16, headdim=24, rank=2, states=True,
              cu_seqlens=[0, 1, 14, 17])
    errs = _check(dtype, config=cfg, **kw)
    assert cfg.scan_gather
    assert _check(dtype, config=dataclasses.replace(cfg, scan_gather=False), **kw) == errs
    assert len(scan_calls) == 2


@pytest.mark.parametrize("flags", [dict(scan_states=True), dict(scan_dstates=True),
                                   dict(scan_states=True, scan_dstates=True)], ids=["states", "dstates", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_scan_state_passes_backward(dtype, flags, scan_calls, monkeypatch):
    """``MimoConfig.scan_states`` / ``scan_dstates``: the backward takes the states entering its state chunks from the
    scan kernel's states-only walk, and its reverse pass (dS_end, the input state's gradient, the decays' gradient
    through the incoming states) from ``mimo_state_scan_bwd_kernel``. Every gradient against float64, with input and
    final states, packed sequences of 1, 13 and 3 tokens (the idle iterations of the short ones must not store) and
    two P blocks (P = 24 in blocks of 16: the reverse walk's decay-gradient partials are summed over them)."""
    from mamba3.ops.mimo import launch
    from mamba3.ops.mimo.configs import MimoConfig
    from mamba3.testing.calls import count_calls

    calls = count_calls(monkeypatch, launch, "scan_states", "state_scan_bwd")
    cfg = MimoConfig(**SCAN, scan_bp=16, **flags, name="tiny-scan-passes")
    _check(dtype, config=cfg, bsz=1, seqlen=17, nheads=4, ngroups=2, dstate=16, headdim=24, rank=2, states=True,
           cu_seqlens=[0, 1, 14, 17], rms_norm=dtype == torch.float32)
    assert scan_calls
    assert bool(calls["scan_states"]) == flags.get("scan_states", False)
    assert bool(calls["state_scan_bwd"]) == flags.get("scan_dstates", False)


class _LaunchRecorder:
    """Stands in for a kernel object: records (grid's first axis, BK, num_warps) of each ``kernel[grid](...)`` launch,
    then launches it."""

    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.seen.append((grid[0], kw["BK"], kw["num_warps"]))
            return self.kernel[grid](*args, **kw)
        return launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reverse_walk_pair_blocks(dtype, scan_calls, monkeypatch):
    """``MimoConfig.dstates_bk``: the backward's reverse state walk on N-pair blocks narrower than the forward's (N = 32
    in two 8-column blocks here, each walk's decay-gradient partial summed over the four (P, N) blocks), against
    float64, with input and final states, packed sequences of 1, 13 and 3 tokens, GQA; its register cap
    (``dstates_maxnreg``) is a launch option on sm_90 only (the interpreter takes it as given)."""
    from mamba3.ops.mimo import launch
    from mamba3.ops.mimo.configs import MimoConfig

    seen = []
    monkeypatch.setattr(launch, "mimo_state_scan_bwd_kernel", _LaunchRecorder(launch.mimo_state_scan_bwd_kernel, seen))
    cfg = MimoConfig(**SCAN, scan_bp=16, scan_dstates=True, dstates_bk=8, dstates_maxnreg=128, name="tiny-dsb8")
    _check(dtype, config=cfg, bsz=1, seqlen=17, nheads=4, ngroups=2, dstate=32, headdim=24, rank=2, states=True,
           cu_seqlens=[0, 1, 14, 17])
    assert scan_calls
    assert seen == [(4, 8, 4)], seen  # two P blocks × two N-pair blocks, at state_warps
    assert cfg.dstates_options(90, False)["maxnreg"] == 128
    assert "maxnreg" not in cfg.dstates_options(90, True) and "maxnreg" not in cfg.dstates_options(89, False)


@pytest.mark.parametrize("dtype,y16", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)],
                         ids=["fp32", "bf16", "bf16-y16"])
def test_bwd_walk_y(dtype, y16, scan_calls, monkeypatch):
    """``MimoConfig.bwd_walk_y``: the backward's states-only walk also forms y before the epilogue, as the forward
    walk did, and the output kernel's backward loads it instead of forming it again. Here the forward's P blocks are
    the walk's (no fused norm), so it is the y that ``save_y`` keeps from the forward: every error is the same number
    as with ``save_y``, and within the bars against float64; with ``save_y16`` both store it in bf16. Two P blocks,
    D, packed sequences of 1, 13 and 3 tokens, input states, GQA."""
    from mamba3.ops.mimo import launch
    from mamba3.ops.mimo.configs import MimoConfig
    from mamba3.testing.calls import count_calls

    cfg = MimoConfig(**SCAN, scan_bp=16, scan_states=True, save_y16=y16, name="tiny-walk-y")
    kw = dict(bsz=1, seqlen=17, nheads=4, ngroups=2, dstate=16, headdim=24, rank=2, states=True,
              cu_seqlens=[0, 1, 14, 17])
    buffers = count_calls(monkeypatch, launch, "new_ys")["new_ys"]
    errs = _check(dtype, config=dataclasses.replace(cfg, bwd_walk_y=True), **kw)
    assert len(buffers) == 1  # the backward's, for the walk
    assert buffers[0].dtype == (torch.bfloat16 if y16 else torch.float32)
    assert _check(dtype, config=dataclasses.replace(cfg, save_y=True), **kw) == errs
    assert len(scan_calls) == 2


@pytest.mark.parametrize("flags", [dict(scan_states=True), dict(scan_dstates=True),
                                   dict(scan_states=True, scan_dstates=True), {}, dict(scan_fwd=False, state_tiles=2)],
                         ids=["scan-states", "scan-dstates", "scan-both", "chunked-passes", "chunked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_bwd_states16(dtype, flags, monkeypatch):
    """``MimoConfig.bwd_states16``: with 16-bit inputs the copies of S (entering each state chunk) and dS (at each
    chunk's end) that the backward's chunk kernels read are stored in bf16, by the scan passes or the chunked ones
    (after the scan forward or the chunked one); fp32 inputs keep fp32. Every gradient against float64; the forward
    is not touched (the output's and the final states' errors are the same numbers), the gradients are (16-bit
    inputs: some error differs), and with fp32 inputs nothing is (every error the same). Two P blocks, packed
    sequences of 1, 13 and 3 tokens, input states, GQA."""
    from mamba3.ops.mimo import launch
    from mamba3.ops.mimo.configs import MimoConfig
    from mamba3.testing.calls import count_calls

    copies = count_calls(monkeypatch, launch, "states_dtype")["states_dtype"]
    cfg = MimoConfig(**dict(SCAN, scan_bp=16, **flags), name="tiny-states16")
    kw = dict(bsz=1, seqlen=17, nheads=4, ngroups=2, dstate=16, headdim=24, rank=2, states=True,
              cu_seqlens=[0, 1, 14, 17], rms_norm=True)
    errs = _check(dtype, config=dataclasses.replace(cfg, bwd_states16=True), **kw)
    assert copies == [torch.float32 if dtype == torch.float32 else torch.bfloat16] * 2, copies  # S, then dS
    again = _check(dtype, config=cfg, **kw)
    forward = [k for k in errs if not k.startswith("d_")]  # the output and the final states
    assert [errs[k] for k in forward] == [again[k] for k in forward], (errs, again)
    assert (errs == again) == (dtype == torch.float32), (errs, again)


def test_scan_forward_needs_one_tile_per_state_chunk():
    from mamba3.ops.mimo.configs import MimoConfig

    with pytest.raises(ValueError, match="state_tiles=1"):
        MimoConfig(**dict(SCAN, state_tiles=2), name="bad")


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "chunked"])
@pytest.mark.parametrize("dtype,y16", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)],
                         ids=["fp32", "bf16", "bf16-y16"])
def test_save_y(dtype, y16, scan, monkeypatch):
    """``MimoConfig.save_y``: the forward (the scan walk, or the chunked output kernel) keeps y before the epilogue
    and the epilogue's backward reads it (``save_y16``: kept in bf16). Every gradient against float64, with the
    fused RMSNorm, z, φ, input states, packed sequences; in fp32 the same errors as computing y again (to fp32
    rounding)."""
    from mamba3.ops.mimo import launch
    from mamba3.ops.mimo.configs import MimoConfig
    from mamba3.testing.calls import count_calls

    kept = count_calls(monkeypatch, launch, "new_ys")["new_ys"]  # the y buffers the forward allocated
    cfg = MimoConfig(**SCAN, name="tiny-scan") if scan else MimoConfig(**dict(SCAN, scan_fwd=False, state_tiles=2),
                                                                         name="tiny")
    kw = dict(bsz=1, seqlen=19, nheads=2, ngroups=1, dstate=32, headdim=16, rank=2, states=True, rms_norm=True,
              cu_seqlens=[0, 13, 19])
    errs = _check(dtype, config=dataclasses.replace(cfg, save_y=True, save_y16=y16), **kw)
    assert [y.dtype for y in kept] == [torch.bfloat16 if y16 else torch.float32]
    again = _check(dtype, config=cfg, **kw)
    assert len(kept) == 1
    if dtype == torch.float32:
        for name, e in errs.items():
            assert abs(e - again[name]) <= 1e-7 + 0.05 * again[name], (name, e, again[name])


@pytest.mark.parametrize("state_tiles", [1, 2], ids=["tile-per-chunk", "two-tiles-per-chunk"])
@pytest.mark.parametrize("dtype,dots16,dqk16,dpw16", [
    (torch.float32, False, False, False), (torch.bfloat16, False, False, False), (torch.bfloat16, True, False, False),
    (torch.bfloat16, True, True, False), (torch.bfloat16, True, False, True), (torch.float16, True, False, True),
    (torch.float32, False, False, True)],
    ids=["fp32", "bf16", "bf16-dots16", "bf16-dots16-dqk16", "bf16-dots16-dpw16", "fp16-dots16-dpw16", "fp32-dpw16"])
def test_bwd_store_dpw(dtype, dots16, dqk16, dpw16, state_tiles, monkeypatch):
    """``MimoConfig.bwd_store_dpw``: the dq / dk kernels load the weighted dP blocks the dv kernel stored (one per
    key tile, head and query tile of the chunk: with two tiles per state chunk, the blocks of the earlier and later
    tiles too), against float64 and against forming them again; two N-pair blocks (N = 64 in 16-column blocks),
    GQA, input states, packed sequences of 1, 13 and 5 tokens (ragged tiles). With 16-bit backward dots the dv
    kernel's dP comes from 16-bit operands where the dq / dk kernels' comes from tf32 ones, so only the float64
    bars apply there; with 16-bit dq / dk dots too (``bwd16_dqk``) both come from 16-bit operands, and the blocks
    are stored in bf16 (fp16 for fp16 inputs); with ``dpw16`` the blocks are bf16 for 16-bit inputs (tf32 dq / dk
    dots widen them), fp32 for fp32 inputs."""
    from mamba3.ops.mimo import launch
    from mamba3.ops.mimo.configs import MimoConfig
    from mamba3.testing.calls import count_calls

    stored = count_calls(monkeypatch, launch, "dpw_dtype")["dpw_dtype"]  # the blocks' dtype per backward
    cfg = MimoConfig(bm=16, bm_bwd=16, bk=32, bk_bwd=16, state_tiles=state_tiles, bp_state=16, warps=4,
                     warps_bwd=4, state_warps=4, bwd_dots16=dots16, bwd16_dqk=dqk16, dpw16=dpw16, name="tiny-dpw")
    kw = dict(bsz=1, seqlen=19, nheads=4, ngroups=2, dstate=64, headdim=16, rank=2, states=True,
              cu_seqlens=[0, 1, 14, 19])
    errs = _check(dtype, config=dataclasses.replace(cfg, bwd_store_dpw=True), **kw)
    expect = (torch.float32 if dtype == torch.float32 else dtype if dqk16 else
              torch.bfloat16 if dpw16 else torch.float32)
    assert stored == [expect], stored
    if dqk16 or not (dots16 or expect == torch.bfloat16):  # the same products as forming dP in the dq / dk kernels
        again = _check(dtype, config=cfg, **kw)
        for name, e in errs.items():  # both 16-bit, or tf32 / tf32x3 on fp32 blocks: the same error to rounding
            assert abs(e - again[name]) <= 1e-6 + 0.05 * again[name], (name, e, again[name])


@pytest.mark.parametrize("fwd_rows,bwd_rows", [(16, 0), (16, 32), (32, 16)], ids=["bwd-capped", "bwd32", "bwd16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fp32_tile_rows(dtype, fwd_rows, bwd_rows):
    """``MimoConfig.bm_fp32``: fp32 inputs run the tiles of the configuration with those rows and the state chunk as
    long, the backward's tile capped to them or, with ``bm_bwd_fp32``, longer or shorter than the forward's (the
    same results as that configuration written out); bf16 inputs run ``bm``'s. Against float64, with packed
    sequences (ragged tiles), input states, GQA."""
    from mamba3.ops.mimo.configs import MimoConfig

    tiles = dict(bk=16, bk_bwd=16, bp_state=16, warps=4, warps_bwd=4, state_warps=4)
    cfg = MimoConfig(bm=32, bm_bwd=32, state_tiles=1, bm_fp32=fwd_rows, bm_bwd_fp32=bwd_rows, name="tiny-fp32rows",
                     **tiles)
    same = (MimoConfig(bm=fwd_rows, bm_bwd=bwd_rows or fwd_rows, state_tiles=32 // fwd_rows, name="tiny-rows",
                       **tiles)
            if dtype == torch.float32 else MimoConfig(bm=32, bm_bwd=32, state_tiles=1, name="tiny-32rows", **tiles))
    kw = dict(bsz=1, seqlen=21, nheads=4, ngroups=2, dstate=32, headdim=16, rank=2, states=True,
              cu_seqlens=[0, 3, 16, 21])
    assert _check(dtype, chunk_size=16, config=cfg, **kw) == _check(dtype, chunk_size=16, config=same, **kw)


@pytest.mark.parametrize("arch,dtype", [(90, torch.bfloat16), (90, torch.float32), (89, torch.bfloat16)],
                         ids=["sm90-bf16", "sm90-fp32", "sm89-bf16"])
def test_dqk_tiles_sm90(arch, dtype, monkeypatch):
    """``MimoConfig.bk_dqk90`` / ``warps_dqk90``: with 16-bit inputs on sm_90 the dq and dk kernels run on those tiles
    (here one 32-column N-pair block at N = 64 instead of two 16-column ones), with the results of the configuration
    that sets them as ``bk_bwd`` / ``warps_bwd`` (the dv kernel's block fixed by ``bk_dv``); fp32 inputs and other
    architectures keep the configured tiles. Packed sequences, GQA, input states, two tiles per state chunk."""
    from mamba3.dispatch import arch_spec
    from mamba3.ops.mimo import function, launch
    from mamba3.ops.mimo.configs import MimoConfig

    monkeypatch.setattr(function, "_device_spec", lambda device: arch_spec(arch))
    seen = []
    monkeypatch.setattr(launch, "mimo_bwd_dqk_kernel", _LaunchRecorder(launch.mimo_bwd_dqk_kernel, seen))
    tiles = dict(bm=16, bm_bwd=16, bk=32, bp_state=16, warps=4, state_warps=4, bk_dv=16, state_tiles=2,
                 bwd_store_dpw=True, dpw16=True)
    cfg = MimoConfig(bk_bwd=16, warps_bwd=4, bk_dqk90=32, warps_dqk90=8, name="tiny-dqk90", **tiles)
    kw = dict(bsz=1, seqlen=19, nheads=4, ngroups=2, dstate=64, headdim=16, rank=2, states=True,
              cu_seqlens=[0, 1, 14, 19])
    errs = _check(dtype, config=cfg, **kw)
    wide = arch == 90 and dtype != torch.float32
    assert seen == [(1, 32, 8) if wide else (2, 16, 4)] * 2, seen  # the dq launch, then the dk one
    same = MimoConfig(bk_bwd=32 if wide else 16, warps_bwd=8 if wide else 4, name="tiny-written-out", **tiles)
    assert _check(dtype, config=same, **kw) == errs


def test_register_caps_are_launch_options():
    """``MimoConfig.fwd_out_maxnreg`` / ``bwd_out_maxnreg`` / ``state_maxnreg`` only cap the registers of the output
    kernel's forward / backward / the chunk-state kernel (on sm_90, 16-bit inputs): the kernels and their results
    are those without them (the interpreter takes the option and has no registers to cap)."""
    from mamba3.ops.mimo.configs import CONFIGS, output_launch_options, register_cap

    cfg = dataclasses.replace(CONFIGS[16][0], fwd_out_maxnreg=0, bwd_out_maxnreg=0, state_maxnreg=0, name="tiny")
    capped = dataclasses.replace(cfg, fwd_out_maxnreg=160, bwd_out_maxnreg=168, state_maxnreg=96)
    assert (capped.output_maxnreg(False, 64), capped.output_maxnreg(True, 64)) == (160, 168)
    assert (capped.output_maxnreg(False, 128), capped.output_maxnreg(True, 128)) == (0, 0)  # N = 256: N blocks
    assert output_launch_options(90, 16, False, 0, capped.output_maxnreg(False, 64)) == {"maxnreg": 160}
    assert register_cap(90, False, capped.state_maxnreg) == {"maxnreg": 96}
    assert register_cap(90, True, 96) == {}  # fp32 inputs: not timed with it
    assert register_cap(86, False, 96) == {}  # fewer CTAs per SM there: the cap only spills
    assert output_launch_options(100, 32, True, 0, 160) == {"maxnreg": 255}  # the collapse's cap stays
    kw = dict(bsz=1, seqlen=17, states=True, **SMALL)
    assert _check(torch.bfloat16, config=capped, **kw) == _check(torch.bfloat16, config=cfg, **kw)
