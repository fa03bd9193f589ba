"""Triton decode-step kernel under the interpreter (TRITON_INTERPRET=1, set by conftest): against the PyTorch
step reference at tiny shapes, SISO and MIMO in every output mode, ragged P/N, N tiles, bf16 inputs, pooled
states with padding rows, and no writes outside the addressed state rows."""
import math

import pytest
import torch

from mamba3.ops.step import mamba3_mimo_step, mamba3_siso_step
from mamba3.ops.step.configs import StepConfig
from mamba3.ops.step.launch import build_launches, step_triton
from mamba3.ops.step.reference import step_reference
from mamba3.testing.errors import assert_rel_close


def make(bsz, H, G, P, N, R, A, dtype, siso, seed, pool=None, shared=False, per_rank=False, norm=False):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)
    S = pool or bsz
    x = dict(
        q=rnd(bsz, R, G, N).to(dtype), k=rnd(bsz, R, G, N).to(dtype), v=rnd(bsz, H, P).to(dtype),
        adt=-torch.rand(bsz, H, generator=g) * 0.5, dt=torch.rand(bsz, H, generator=g) * 0.1 + 0.01,
        trap=rnd(bsz, H), q_bias=1 + 0.1 * rnd(H, R, N), k_bias=1 + 0.1 * rnd(H, R, N),
        mimo_v=None if siso else 1 + 0.2 * rnd(H, R, P), mimo_z=None if siso else 1 + 0.2 * rnd(H, R, P),
        mimo_out=None if siso or per_rank else 1 + 0.2 * rnd(H, R, P),
        angles=rnd(bsz, A) if shared else rnd(bsz, H, A), D=rnd(H), z=rnd(bsz, H, P).to(dtype),
        angle_state=torch.rand(S, H, A, generator=g) * 2 * math.pi, ssm_state=0.3 * rnd(S, H, P, N),
        k_state=rnd(S, R, H, N), v_state=rnd(S, H, P).to(dtype), state_batch_indices=None,
        rms_norm=norm, norm_weight=(1 + 0.1 * rnd(H, P)) if norm else None, norm_eps=1e-5)
    return x


ORDER = ["q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "mimo_v", "mimo_z", "mimo_out", "angles", "D",
         "z", "angle_state", "ssm_state", "k_state", "v_state", "state_batch_indices", "rms_norm", "norm_weight",
         "norm_eps"]


def both(x, siso, config=None):
    """(triton out, states), (reference out, states) from independent copies of the states."""
    def run(fn, **kw):
        y = dict(x)
        for s in ("angle_state", "ssm_state", "k_state", "v_state"):
            y[s] = x[s].clone()
        out = fn(*[y[n] for n in ORDER], **kw)
        return out, tuple(y[s] for s in ("angle_state", "ssm_state", "k_state", "v_state"))
    tri = run(step_triton, siso=siso, config=config)
    ref = run(step_reference, pairing="adjacent" if siso else "half", siso=siso)
    return tri, ref


def check(tri, ref, tol):
    assert_rel_close("out", tri[0], ref[0], tol)
    for name, a, b in zip(("angle", "ssm", "k", "v"), tri[1], ref[1]):
        assert_rel_close(f"{name} state", a.float(), b.float(), tol)
    assert (tri[1][0] >= 0).all() and (tri[1][0] < 2 * math.pi).all()


CASES = [
    # (name, H, G, P, N, R, A, siso, extra)
    ("siso-p16-n16", 2, 1, 16, 16, 1, 4, True, {}),
    ("siso-gqa-ragged-p12-n20-shared", 4, 2, 12, 20, 1, 5, True, dict(shared=True)),
    ("mimo2-p16-n16", 2, 1, 16, 16, 2, 4, False, {}),
    ("mimo2-p8-n32-norm", 2, 2, 8, 32, 2, 8, False, dict(norm=True)),
    ("mimo3-p8-n16-per-rank", 2, 1, 8, 16, 3, 8, False, dict(per_rank=True)),
    ("mimo2-p8-n16-norm-per-rank", 2, 1, 8, 16, 2, 2, False, dict(norm=True, per_rank=True)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_step_kernel_matches_reference(case):
    _, H, G, P, N, R, A, siso, extra = case
    x = make(2, H, G, P, N, R, A, torch.float32, siso, seed=1, **extra)
    check(*both(x, siso), 1e-5)


@pytest.mark.parametrize("N", [32, 20])
@pytest.mark.parametrize("siso", [True, False], ids=["siso", "mimo"])
def test_state_streamed_in_several_n_tiles(siso, N):
    x = make(2, 2, 1, 8, N, 1 if siso else 2, 8, torch.float32, siso, seed=2)
    # 2 P tiles × 3-4 N tiles (SISO: 8 dimensions; MIMO: pair blocks of 4 columns from each half, the last one
    # ragged at N = 20) per head, the next tile prefetched
    check(*both(x, siso, config=StepConfig(block_p=4, block_n=8, num_warps=1)), 1e-5)



@pytest.mark.parametrize("row_tiles", [2, 3, 4], ids=["two-programs-per-head", "one-program-exactly-p",
                                                      "one-program-writes-small-states"])
@pytest.mark.parametrize("siso", [True, False], ids=["siso", "mimo"])
def test_rows_streamed_per_program(siso, row_tiles):
    # P = 12 in tiles of 4 rows: 2 tiles per program (programs of 8 and 4 valid rows, the rows kernel after them),
    # 3 (one program per row and head holding exactly P rows) or 4 (one program per row and head,
    # the last tile empty, the small states written by it); pooled states with a padded row, NaN in every row
    # that is not addressed
    x = make(3, 2, 1, 12, 20, 1 if siso else 2, 6, torch.float32, siso, seed=8, pool=5)
    x["state_batch_indices"] = torch.tensor([4, -1, 1], dtype=torch.int32)
    for s in ("angle_state", "ssm_state", "k_state", "v_state"):
        x[s][torch.tensor([0, 2, 3])] = float("nan")
    config = StepConfig(block_p=4, block_n=32, num_warps=1, row_tiles=row_tiles)
    launches, _ = build_launches(*[x[n] for n in ORDER], siso=siso, config=config)
    assert len(launches) == (1 if row_tiles >= 3 else 2)
    tri, ref = both(x, siso, config=config)
    assert torch.equal(tri[0][1], torch.zeros_like(tri[0][1]))
    assert_rel_close("out", tri[0], ref[0], 1e-5)
    rows = torch.tensor([4, 1])
    for name, a, b in zip(("angle", "ssm", "k", "v"), tri[1], ref[1]):
        assert_rel_close(f"{name} state", a[rows].float(), b[rows].float(), 1e-5)
        assert torch.isnan(a[torch.tensor([0, 2, 3])]).all()

def test_ragged_p_tiles():
    x = make(2, 2, 1, 12, 16, 2, 4, torch.float32, False, seed=7, per_rank=True)
    check(*both(x, False, config=StepConfig(block_p=8, block_n=16, num_warps=1)), 1e-5)   # 8 + 4 valid rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_inputs(dtype):
    x = make(2, 2, 1, 16, 16, 2, 4, dtype, False, seed=3)
    tri, ref = both(x, False)
    assert tri[0].dtype == dtype and tri[1][1].dtype == torch.float32
    assert_rel_close("out", tri[0], ref[0], 1e-2)
    assert_rel_close("ssm", tri[1][1], ref[1][1], 1e-5)


def test_pooled_states_padding_and_no_stray_writes():
    x = make(3, 2, 1, 8, 16, 2, 4, torch.float32, False, seed=4, pool=6)
    x["state_batch_indices"] = torch.tensor([5, -1, 2], dtype=torch.int32)
    # NaN in every pool row that is not addressed: a stray read would poison the outputs, a stray write is seen
    for s in ("angle_state", "ssm_state", "k_state", "v_state"):
        x[s][torch.tensor([0, 1, 3, 4])] = float("nan")
    tri, ref = both(x, False)
    assert torch.equal(tri[0][1], torch.zeros_like(tri[0][1]))
    assert torch.isfinite(tri[0]).all()
    rows = torch.tensor([5, 2])
    assert_rel_close("out", tri[0], ref[0], 1e-5)
    for a, b, orig in zip(tri[1], ref[1], (x["angle_state"], x["ssm_state"], x["k_state"], x["v_state"])):
        assert_rel_close("pooled state", a[rows], b[rows], 1e-5)
        assert torch.isnan(a[torch.tensor([0, 1, 3, 4])]).all()


def test_public_functions_dispatch_to_triton():
    x = make(2, 2, 1, 8, 16, 1, 4, torch.float32, True, seed=5)
    states = (x["angle_state"].clone(), x["ssm_state"].clone(), x["k_state"][:, 0].clone(), x["v_state"].clone())
    out = mamba3_siso_step(x["q"][:, 0], x["k"][:, 0], x["v"], x["adt"], x["dt"], x["trap"], x["q_bias"][:, 0],
                           x["k_bias"][:, 0], x["angles"], x["D"], x["z"], states, backend="triton")
    ref = both(x, True)[1]
    assert_rel_close("siso out", out, ref[0], 1e-5)
    x = make(2, 2, 1, 8, 16, 2, 4, torch.float32, False, seed=6)
    states = tuple(x[s].clone() for s in ("angle_state", "ssm_state", "k_state", "v_state"))
    out = mamba3_mimo_step(x["q"], x["k"], x["v"], x["adt"], x["dt"], x["trap"], x["q_bias"], x["k_bias"],
                           x["mimo_v"], x["mimo_z"], x["mimo_out"], x["angles"], x["D"], x["z"], states,
                           backend="triton")
    assert_rel_close("mimo out", out, both(x, False)[1][0], 1e-5)


def test_chooser_gives_mimo_one_program_per_row_and_head_only_for_large_batches():
    from mamba3.ops.step.configs import StepProblem, choose_config

    large = choose_config(None, StepProblem(64, 128, 4, row_heads=128 * 64))
    assert (large.block_p, large.block_n, large.row_tiles) == (8, 128, 8)
    assert choose_config(None, StepProblem(64, 128, 4, row_heads=8 * 64)).row_tiles == 1   # small batch: 8 per head
    assert choose_config(None, StepProblem(64, 256, 4, row_heads=128 * 64)).row_tiles == 1  # N in two tiles
    assert choose_config(None, StepProblem(64, 128, 1, row_heads=128 * 64)).row_tiles == 1  # SISO: rows kernel
    x = make(2, 2, 1, 8, 16, 2, 4, torch.float32, False, seed=9)
    launches, _ = build_launches(*[x[n] for n in ORDER], siso=False,
                                 config=choose_config(None, StepProblem(8, 16, 2, row_heads=1024)))
    assert [k.__name__ for k, *_ in launches] == ["mamba3_step_kernel"]
    with pytest.raises(ValueError, match="row_tiles=2 needs whole rows"):   # N in two tiles: one row tile each
        build_launches(*[x[n] for n in ORDER], siso=False, config=StepConfig(block_p=4, block_n=8, num_warps=1,
                                                                              row_tiles=2))
