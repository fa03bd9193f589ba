"""SISO Triton kernels under the interpreter, forward and backward, against the float64 recurrent definition.

Shapes are tiny (the interpreter costs ~5 ms per program instance). Bars as for the GPU: fp32 output ≤ 1e-5,
gradients ≤ 1e-4; bf16 output ≤ 3e-3, gradients ≤ 1e-2 (relative Frobenius error per tensor). Every failure
message lists the error of every tensor.
"""
import pytest
import torch

from mamba3.ops.siso.check import assert_same_results, make_case, run_and_compare, siso_kernel

CASES = {
    # name: (make_case kwargs, chunk_size)
    "fp32-T17": (dict(T=17), 16),
    "fp32-T1-noDZ-fullrot": (dict(T=1, D=False, Z=False, A=8), 16),
    "fp32-T70-gqa-states": (dict(T=70, H=4, G=2, states=True), 16),
    "fp32-varlen-shared-states": (dict(B=1, T=40, cu=[0, 5, 21, 40], shared=True, states=True), 16),
    # a sequence's first token takes no d scale from the previous sequence's last one (trap_grad_kernel)
    "fp32-varlen": (dict(B=1, T=40, cu=[0, 5, 21, 40]), 16),
    # no rotation (A = 0): no angle backward, trap_grad_kernel without the angles' d dt
    "fp32-T20-no-angles-states": (dict(T=20, A=0, states=True), 16),
    "fp32-T70-chunk32": (dict(T=70, B=1), 32),
    "bf16-T70-states": (dict(dtype=torch.bfloat16, T=70, states=True), 16),
    "bf16-varlen-gqa-shared": (dict(dtype=torch.bfloat16, B=1, T=37, H=4, G=1, cu=[0, 17, 18, 37], shared=True), 16),
    "fp16-T33": (dict(dtype=torch.float16, T=33, B=1), 16),
    # N = P = 64: the dispatcher's 16-bit-dot path (interleaved pairs, split q̃/k̃ in bwd_dqk); smaller N or P
    # take the fp32 path (the cases above)
    "bf16-N64-P64-16bit-dots": (dict(dtype=torch.bfloat16, T=40, B=1, N=64, P=64, A=16, states=True), 16),
    # H/G = 16: bwd_dqk splits the group's heads over 8 programs, 2 heads each (fp32 partials summed on the host)
    "fp32-gqa-H16-G1-headsplit": (dict(T=17, B=1, H=16, G=1, states=True), 16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_siso_fwd_bwd(name):
    kw, chunk = CASES[name]
    run_and_compare(make_case(**kw), chunk)


@pytest.mark.parametrize("kw", [dict(T=40), dict(B=1, T=40, cu=[0, 5, 21, 40])], ids=["ragged", "varlen"])
def test_siso_strong_decay(kw):
    """adt = −20 per token (both float64 references agree to 3e-9 in d_adt here). d adt at a chunk's last token
    is the decayed earlier tokens' chunk-state terms, an exclusive prefix; formed as the inclusive cumsum minus the
    token's own term (e^0, which dwarfs them) it came out 0 there: d_adt 0.05 to 0.2 relative."""
    args = make_case(states=True, **kw)
    args["adt"] = torch.full_like(args["adt"], -20.0)
    run_and_compare(args, 16)


def test_siso_multiblock_tiles():
    """bn = bp = 16 at N = P = 32: the loops over N and P blocks, angles spanning two N blocks (A = 12)."""
    import mamba3.ops.siso.function as F
    from mamba3.ops.siso.configs import SisoConfig

    args = make_case(T=40, N=32, P=32, A=12, shared=True, states=True)
    F._CONFIG_OVERRIDE = SisoConfig(chunk=16, bn=16, bp=16, warps_chunk=4, warps_bwd=4, stages=1, half_dots=False,
                                    fp32_prec="tf32x3")
    try:
        run_and_compare(args, 16)
    finally:
        F._CONFIG_OVERRIDE = None


@pytest.mark.parametrize("fp32_prec", ["ieee", "tf32x3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_siso_halves_tiles(dtype, fp32_prec):
    """The even/odd halves as separate fp32 dot operands (stride-2 loads and stores), both fp32-accurate dot
    modes, fp32 and 16-bit inputs, at multi-block tiles (N = P = 64, bn = bp = 32: 16-wide halves)."""
    import mamba3.ops.siso.function as F
    from mamba3.ops.siso.configs import SisoConfig

    args = make_case(dtype=dtype, T=40, B=1, N=64, P=64, A=24, states=True)
    F._CONFIG_OVERRIDE = SisoConfig(chunk=16, bn=32, bp=32, warps_chunk=4, warps_bwd=4, stages=1, half_dots=False,
                                    halves=True, fp32_prec=fp32_prec)
    try:
        run_and_compare(args, 16)
    finally:
        F._CONFIG_OVERRIDE = None


def test_siso_only_final_state_grads():
    """The output unused: gradients flow only from the final angle, ssm and k states (dout is None in backward)."""
    from mamba3.reference import siso_recurrent
    from mamba3.testing.compare import errors, with_grads
    from mamba3.testing.inputs import float64_copy

    args = make_case(T=20, states=True)
    angle, ssm, k, v = args["input_states"]
    upstream = [None, torch.ones(angle.shape, dtype=torch.float64), torch.ones(ssm.shape, dtype=torch.float64),
                torch.ones(k.shape, dtype=torch.float64), None]
    want = with_grads(siso_recurrent, float64_copy(args), upstream)
    got = with_grads(siso_kernel(16), args, upstream)
    for name, err in errors(got, want).items():
        if name.startswith("d_"):
            assert err <= 1e-4, f"{name}: relative Frobenius error {err:.2e} > 1e-4"
    for name, g in want[2].items():            # the final states do not depend on q, D, z: no gradient there
        if g is None:
            assert got[2][name] is None or not got[2][name].any(), f"d_{name} should be zero"


def test_siso_through_public_api():
    import mamba3
    from mamba3.testing.errors import assert_rel_close
    from mamba3.testing.inputs import float64_copy

    args = make_case(T=17)
    out = mamba3.mamba3_siso(**args, backend="triton", chunk_size=16)
    rout = mamba3.mamba3_siso(**float64_copy(args), backend="reference")
    assert_rel_close("out", out, rout, 1e-5)


SCAN_CASES = {name: CASES[name] for name in ("fp32-T70-gqa-states", "fp32-varlen-shared-states",
                                             "bf16-N64-P64-16bit-dots", "fp32-T70-chunk32")}
# fp32 at N = 64: 32-wide N blocks as even/odd halves (the HALVES layout), two blocks
SCAN_CASES["fp32-N64-P32-halves-varlen"] = (dict(B=1, T=45, N=64, P=32, A=12, cu=[0, 20, 45], states=True), 16)


@pytest.mark.parametrize("name", list(SCAN_CASES))
def test_siso_scan_states(name, monkeypatch):
    """``SisoConfig.scan_states``: the chunk states and their pass across chunks (forward, and the backward's
    reverse pass) in one kernel that walks each sequence's chunks, on the dispatcher's tiles for each case."""
    from mamba3.ops.siso.check import force_config, launched_kernels

    force_config(monkeypatch, scan_states=True)
    launched = launched_kernels(monkeypatch)
    kw, chunk = SCAN_CASES[name]
    run_and_compare(make_case(**kw), chunk)
    assert "chunk_state_kernel" not in launched and launched.count("chunk_state_scan_kernel") == 3, launched


@pytest.mark.parametrize("prefetch", [1, 2])
def test_siso_scan_prefetch(prefetch, monkeypatch):
    """``SisoConfig.scan_prefetch``: the scan's walks with the next chunks' table rows (and coefficients) loaded
    ahead (1 or 2 in all three walks) give bit for bit the results of the walks without (0), on sequences of unequal
    chunk counts (steps past a sequence's end, and look-ahead past its last chunk), and meet the float64 bars."""
    from mamba3.ops.siso.check import force_config
    from mamba3.testing.compare import with_grads

    args = make_case(dtype=torch.float32, B=1, T=45, N=32, P=16, A=8, cu=[0, 10, 45], states=True)
    force_config(monkeypatch, scan_states=True, scan_prefetch=(0, 0, 0))
    want = with_grads(siso_kernel(16), args)
    monkeypatch.undo()
    force_config(monkeypatch, scan_states=True, scan_prefetch=(prefetch,) * 3)
    assert_same_results(with_grads(siso_kernel(16), args, want[3]), want)
    run_and_compare(args, 16)


@pytest.mark.parametrize("dtype,B,T,cu,sms,forced,want", [
    ("bf16", 8, 4096, None, 132, None, True),     # H200 at the shape: 512 programs
    ("bf16", 4, 8192, None, 132, None, True),     # 256 programs (≥ 1.5 per SM)
    ("bf16", 2, 16384, None, 132, None, False),   # 128 programs: chunked was faster
    ("bf16", 8, 4096, None, None, None, False),   # unknown SM count (AOT targets, the interpreter)
    ("fp32", 8, 4096, None, 132, None, False),    # fp32 dots: the scan was no faster
    ("bf16", 1, 4096, [0, 64, 4096], 1, None, False),            # unequal lengths
    ("bf16", 1, 4096, [0, 2048, 4096], 1, None, True),           # equal lengths (varlen)
    ("bf16", 2, 16384, None, 132, True, True), ("bf16", 8, 4096, None, 132, False, False),  # the config decides
])
def test_scan_states_choice(dtype, B, T, cu, sms, forced, want):
    """``function._scan_states``: the launcher's rule for the one-kernel chunk-state scan (H = 32, N = 128, P = 64:
    two 64 × 64 state blocks per head on the 16-bit path)."""
    import dataclasses

    from mamba3.dispatch import DeviceSpec
    from mamba3.ops.siso import function as F

    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    q, v = torch.empty(B, T, 1, 128, dtype=dt), torch.empty(B, T, 32, 64, dtype=dt)
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    F._SPEC_OVERRIDE = DeviceSpec(name="test", arch=90, smem_optin=232_448, sm_count=sms)
    try:
        ctx = F._Ctx(q, v, torch.empty(B, T, 8), None, None, cu_seqlens, "ieee")
    finally:
        F._SPEC_OVERRIDE = None
    if forced is not None:
        ctx.cfg = dataclasses.replace(ctx.cfg, scan_states=forced)
    assert F._scan_states(ctx) is want


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "chunked"])
@pytest.mark.parametrize("kw", [dict(dtype=torch.bfloat16, T=40, B=1, N=64, P=64, A=16, states=True),
                                dict(dtype=torch.float16, T=50, B=1, N=64, P=64, A=16, cu=[0, 25, 50])],
                         ids=["bf16-states", "fp16-varlen"])
def test_siso_forward_states16(kw, scan, monkeypatch):
    """``SisoConfig.states16``: the forward's chunk-state scan, or ``state_passing`` on the chunk-parallel path,
    stores the states in the 16-bit dot dtype (the output kernel receives that buffer) and the results are
    bit-identical to the fp32 buffer's (that kernel rounds each state to the dot dtype before its dot; the backward
    recomputes fp32 states)."""
    import mamba3.ops.siso.function as F
    from mamba3.ops.siso.check import force_config
    from mamba3.testing.compare import with_grads

    args = make_case(**kw)
    state_dtypes = []
    launch = F.launch

    def record(kernel, grid, *a, **meta):
        if kernel.fn.__name__ == "output_kernel":
            state_dtypes.append(a[12].dtype)  # st_ptr
        launch(kernel, grid, *a, **meta)

    runs, upstream = {}, None
    for states16 in (False, True):
        force_config(monkeypatch, scan_states=scan, states16=states16)
        monkeypatch.setattr(F, "launch", record)
        runs[states16] = with_grads(siso_kernel(16), args, upstream)
        upstream = runs[states16][3]
        monkeypatch.undo()
    assert state_dtypes == [torch.float32, kw["dtype"]], state_dtypes
    assert_same_results(runs[True], runs[False])
    force_config(monkeypatch, scan_states=scan, states16=True)
    run_and_compare(args, 16)


# the 16-bit state copies' cases: one sequence with input states; varlen with two N blocks (fp16)
BACKWARD_STATE_CASES = pytest.mark.parametrize(
    "kw", [dict(dtype=torch.bfloat16, T=40, B=1, N=64, P=64, A=16, states=True),
           dict(dtype=torch.float16, T=50, B=1, N=128, P=64, A=16, cu=[0, 25, 50], states=True)],
    ids=["bf16-states", "fp16-varlen-states-2blocks"])


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "chunked"])
@BACKWARD_STATE_CASES
def test_siso_backward_states16(kw, scan, monkeypatch):
    """``SisoConfig.bwd_states16``: the reverse state pass (the scan, or ``state_passing`` on the chunk-parallel
    path) forms e^{cs_L}⟨dSe, S⟩ (per state block or slab) from the fp32 states and leaves 16-bit copies of S and dS,
    which bwd_dv and bwd_dqk read. Their dots round both to the dot dtype anyway, so every result is bit-identical to
    the fp32 buffers' but d adt, which sums that term in another order (fp32 rounding), and all of them meet the
    float64 bars."""
    import mamba3.ops.common.state_passing as SP
    import mamba3.ops.siso.function as F
    from mamba3.ops.siso.check import force_config
    from mamba3.testing.compare import with_grads

    args = make_case(**kw)
    seen = []
    launch = F.launch

    def record(kernel, grid, *a, **meta):
        name = kernel.fn.__name__
        reverse = meta.get("MODE") == 1 if name == "chunk_state_scan_kernel" else meta.get("REVERSE")
        if name in ("chunk_state_scan_kernel", "state_passing_kernel") and reverse:
            seen.append(("pass", meta["KEND"]))
        if name in ("bwd_dv_kernel", "bwd_dqk_kernel"):
            seen.append((name, a[15].dtype if name == "bwd_dv_kernel" else a[12].dtype))
        launch(kernel, grid, *a, **meta)

    runs, upstream = {}, None
    for flag in (False, True):
        force_config(monkeypatch, scan_states=scan, bwd_states16=flag)
        monkeypatch.setattr(F, "launch", record)
        monkeypatch.setattr(SP, "launch", record)
        runs[flag] = with_grads(siso_kernel(16), args, upstream)
        upstream = runs[flag][3]
        monkeypatch.undo()
    f32, f16 = torch.float32, kw["dtype"]
    assert seen == [("pass", False), ("bwd_dv_kernel", f32), ("bwd_dqk_kernel", f32),
                    ("pass", True), ("bwd_dv_kernel", f16), ("bwd_dqk_kernel", f16)], seen
    assert_same_results(runs[True], runs[False], near=("adt",))
    force_config(monkeypatch, scan_states=scan, bwd_states16=True)
    run_and_compare(args, 16)


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "chunked"])
@BACKWARD_STATE_CASES
def test_siso_save_states(kw, scan, monkeypatch):
    """``save_states``: the backward takes the forward's 16-bit states instead of computing them again (one
    chunk-state launch of MODE 0, the forward's, where there were two) and forms the decay gradient's ⟨dSe, S⟩ from
    them. So every result is bit-identical to the recomputing run (the per-chunk kernels read the same 16-bit
    states) but d adt, whose ⟨dSe, S⟩ term then sees S rounded to 16 bits, and all of them meet the float64 bars."""
    import mamba3.ops.siso.function as F
    from mamba3.ops.siso.check import force_config
    from mamba3.testing.compare import with_grads

    args = make_case(**kw)
    force_config(monkeypatch, scan_states=scan)
    runs, upstream, launch = {}, None, F.launch
    for save in (False, True):
        count = []

        def record(kernel, grid, *a, **meta):
            if kernel.fn.__name__ in ("chunk_state_kernel", "chunk_state_scan_kernel") and meta["MODE"] == 0:
                count.append(kernel.fn.__name__)
            launch(kernel, grid, *a, **meta)

        monkeypatch.setattr(F, "launch", record)
        runs[save] = with_grads(siso_kernel(16, save_states=save), args, upstream), count
        upstream = runs[save][0][3]
    (want, n_want), (got, n_got) = runs[False], runs[True]
    assert (len(n_want), len(n_got)) == (2, 1), (n_want, n_got)
    print(f"d_adt moved {assert_same_results(got, want, near=('adt',), tol=1e-3)['adt']:.2e}")
    run_and_compare(args, 16, save_states=True)


def _store_a1_runs(kw, flag, monkeypatch, bp=None):
    """The case ``kw`` with the SisoConfig ``flag`` off, then on, at chunk 16 (``bp``: that P block forced in both);
    checks that bwd_dv stores and bwd_dqk loads a (nchunks, H, P blocks, 16, 16) buffer of M∘(dY Vᵀ) exactly when it
    is on and returns both runs' results (output, final states, gradients) and the buffer's dtype; then the flag's
    run against the float64 bars."""
    import mamba3.ops.siso.function as F
    from mamba3.ops.siso.check import force_config
    from mamba3.testing.compare import with_grads

    args = make_case(**kw)
    seen = []
    launch = F.launch

    def record(kernel, grid, *a, **meta):
        if kernel.fn.__name__ == "bwd_dv_kernel":
            seen.append(("dv", meta["STORE_A1"], a[22].shape, a[22].dtype))
        if kernel.fn.__name__ == "bwd_dqk_kernel":
            seen.append(("dqk", meta["LOAD_A1"], a[18].shape, a[18].dtype))
        launch(kernel, grid, *a, **meta)

    runs, upstream = {}, None
    tiles = {} if bp is None else dict(bp=bp)
    for on in (False, True):
        force_config(monkeypatch, **tiles, **{flag: on})
        monkeypatch.setattr(F, "launch", record)
        runs[on] = with_grads(siso_kernel(16), args, upstream)
        upstream = runs[on][3]
        monkeypatch.undo()
    nchunks = sum(-(-(b - a) // 16) for a, b in zip(kw["cu"][:-1], kw["cu"][1:])) if "cu" in kw else -(-kw["T"] // 16)
    a1_shape = torch.Size([nchunks, kw.get("H", 2), 1 if bp is None else kw["P"] // bp, 16, 16])
    assert [s[:2] for s in seen] == [("dv", False), ("dqk", False), ("dv", True), ("dqk", True)], seen
    assert seen[2][2:] == seen[3][2:] and seen[2][2] == a1_shape, seen
    force_config(monkeypatch, **tiles, **{flag: True})
    run_and_compare(args, 16)
    return runs[False], runs[True], seen[2][3]


@pytest.mark.parametrize("kw", [dict(dtype=torch.bfloat16, T=40, B=1, N=128, P=64, A=16, states=True),
                                dict(dtype=torch.float16, T=50, B=1, N=64, P=64, A=16, cu=[0, 25, 50], Z=False)],
                         ids=["bf16-states-2nblocks", "fp16-varlen-noZ"])
def test_siso_backward_store_a1(kw, monkeypatch):
    """``SisoConfig.bwd_store_a1``: bwd_dv stores M∘(dY Vᵀ) of each chunk and head in the dot dtype and bwd_dqk
    loads it instead of forming it per N block. Both kernels form it from the same 16-bit operands in one dot over
    P, so every result is bit-identical to the flag off, and all meet the float64 bars."""
    off, on, dtype = _store_a1_runs(kw, "bwd_store_a1", monkeypatch)
    assert dtype == kw["dtype"]
    assert_same_results(on, off)


_FP32_OPERANDS = [dict(T=40, B=1, N=64, P=32, A=16, states=True),
                  dict(T=50, B=1, H=4, G=2, N=64, P=32, A=8, cu=[0, 25, 50], Z=False),
                  dict(dtype=torch.bfloat16, T=40, B=1, N=32, P=32, A=16, states=True),
                  dict(T=40, B=1, N=16, P=16, A=4, states=True)]


@pytest.mark.parametrize("kw,flag,bp", [(kw, "bwd_store_a1_fp32", None) for kw in _FP32_OPERANDS] + [
    (_FP32_OPERANDS[0], "bwd_store_a1_blocks", 16),
    (dict(T=50, B=1, H=4, G=2, N=64, P=64, A=8, cu=[0, 25, 50], Z=False), "bwd_store_a1_blocks", 16),
    (dict(dtype=torch.bfloat16, T=40, B=1, N=32, P=64, A=16, states=True), "bwd_store_a1_blocks", 32)],
    ids=["fp32-states-2nblocks", "fp32-varlen-gqa-noZ", "bf16-fp32-operands", "fp32-N16-joined",
         "blocks-fp32-states-2pblocks", "blocks-fp32-varlen-gqa-noZ-4pblocks", "blocks-bf16-fp32-operands-2pblocks"])
def test_siso_backward_store_a1_fp32(kw, flag, bp, monkeypatch):
    """``SisoConfig.bwd_store_a1_fp32``: the same hand-over on the fp32-operand path (fp32 inputs, and 16-bit inputs
    with N < 64), the buffer in fp32, bwd_dqk reading it and (for the halves' dk) its transpose (N = 16: one
    interleaved block, no halves); ``bwd_store_a1_blocks`` (P blocks of ``bp``): with several P blocks each bwd_dv
    program stores its block's share and bwd_dqk sums the shares. The forward is untouched and every run meets the
    float64 bars. fp32 inputs: the gradients agree with the flag off to fp32 rounding (the transpose was a second
    dot, dY Vᵀ one accumulator over P: sums in another order). 16-bit inputs: bwd_dqk formed dY Vᵀ from the 16-bit
    dy that bwd_dv hands it, bwd_dv forms it from its own fp32 dy, so they agree to 16-bit rounding only (2.0e-3
    apart in d_q in the one-block case)."""
    from mamba3.testing.errors import rel_frobenius

    (out0, fin0, g0, _), (out1, fin1, g1, _), dtype = _store_a1_runs(kw, flag, monkeypatch, bp)
    assert dtype == torch.float32
    assert torch.equal(out0, out1) and all(torch.equal(a, b) for a, b in zip(fin0, fin1))
    if kw.get("dtype", torch.float32) != torch.float32:
        return
    for name in g0:
        assert (g0[name] is None) == (g1[name] is None), name
        if g0[name] is not None:
            err = rel_frobenius(g1[name], g0[name])
            assert err < 1e-6, f"d_{name} differs from the flag off by {err:.2e}"


@pytest.mark.parametrize("kw,scan", [
    (dict(T=40, B=1, N=128, P=32, A=24, states=True), False),
    (dict(T=50, B=1, H=4, G=2, N=64, P=32, A=8, cu=[0, 25, 50], Z=False), False),
    (dict(T=45, B=1, N=64, P=32, A=12, cu=[0, 20, 45], states=True), True),
    (dict(dtype=torch.bfloat16, T=40, B=1, N=32, P=32, A=16, states=True), False),
], ids=["fp32-N128-states", "fp32-varlen-gqa-noZ", "fp32-varlen-scan-states", "bf16-fp32-operands"])
def test_siso_contiguous_halves(kw, scan, monkeypatch):
    """``SisoConfig.contiguous_halves``: the fp32-operand path's pair tiles (k in the chunk states, q / k / states in
    the output kernel, the scan's input state) loaded as contiguous tiles and split in registers, the chunk states,
    final states and dq / dk stored re-interleaved, bwd_dv's and bwd_dqk's loads contiguous too, instead of
    stride-2 loads and stores. The same values move, so every result is bit-identical to the flag off
    (the interpreter's arithmetic does not depend on layouts); the flag's run meets the float64 bars."""
    from mamba3.ops.siso.check import force_config
    from mamba3.testing.compare import with_grads

    args = make_case(**kw)
    runs = []
    for on in (False, True):
        force_config(monkeypatch, contiguous_halves=on, scan_states=scan)
        runs.append(with_grads(siso_kernel(16), args, runs[0][3] if runs else None))
        monkeypatch.undo()
    assert_same_results(runs[1], runs[0])
    force_config(monkeypatch, contiguous_halves=True, scan_states=scan)
    run_and_compare(args, 16)
