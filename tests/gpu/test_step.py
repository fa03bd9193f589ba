"""Triton decode step on CUDA: every supported head size and state size, SISO and MIMO, fp32/bf16/fp16 inputs,
against the float64 step reference over many chained tokens; bounds safety (the official kernel writes out of
bounds when headdim % 64 != 0), pooled states, determinism, CUDA-graph capture, long decodes."""
import math

import pytest
import torch

from mamba3.ops.step import mamba3_mimo_step, mamba3_siso_step
from mamba3.testing.errors import assert_rel_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def inputs(bsz, T, H, G, P, N, R, dtype, siso, seed, shared=True, per_rank=False, norm=False):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)
    A = N // 4 if siso else N // 2
    x = dict(q=rnd(T, bsz, R, G, N), k=rnd(T, bsz, R, G, N), v=rnd(T, bsz, H, P), z=rnd(T, bsz, H, P),
             adt=-torch.rand(T, bsz, H, generator=g) * 0.3, dt=torch.rand(T, bsz, H, generator=g) * 0.1 + 0.001,
             trap=rnd(T, bsz, H), angles=rnd(T, bsz, A) if shared else rnd(T, bsz, H, A),
             q_bias=1 + 0.1 * rnd(H, R, N), k_bias=1 + 0.1 * rnd(H, R, N), D=rnd(H),
             mimo_v=None if siso else 1 + 0.2 * rnd(H, R, P), mimo_z=None if siso else 1 + 0.2 * rnd(H, R, P),
             mimo_out=None if siso or per_rank else (1 + 0.2 * rnd(H, R, P)) / R,
             norm_weight=(1 + 0.1 * rnd(H, P)) if norm else None)
    q_norm = lambda t: t * torch.rsqrt(t.square().mean(-1, keepdim=True) + 1e-6)
    x["q"], x["k"] = q_norm(x["q"]), q_norm(x["k"])
    states = (torch.rand(bsz, H, A, generator=g) * 2 * math.pi, 0.1 * rnd(bsz, H, P, N), rnd(bsz, R, H, N),
              rnd(bsz, H, P))
    low = {"q", "k", "v", "z"}
    x = {n: (None if t is None else t.to(DEV, dtype if n in low else torch.float32)) for n, t in x.items()}
    states = tuple(s.to(DEV) for s in states[:3]) + (states[3].to(DEV, dtype),)
    return x, states


def run(x, states, siso, t, backend, **kw):
    z = None if x["z"] is None else x["z"][t]
    if siso:
        return mamba3_siso_step(x["q"][t][:, 0], x["k"][t][:, 0], x["v"][t], x["adt"][t], x["dt"][t], x["trap"][t],
                                x["q_bias"][:, 0], x["k_bias"][:, 0], x["angles"][t], x["D"], z,
                                (states[0], states[1], states[2][:, 0], states[3]), backend=backend, **kw)
    return mamba3_mimo_step(x["q"][t], x["k"][t], x["v"][t], x["adt"][t], x["dt"][t], x["trap"][t], x["q_bias"],
                            x["k_bias"], x["mimo_v"], x["mimo_z"], x["mimo_out"], x["angles"][t], x["D"], z,
                            states, rms_norm=x["norm_weight"] is not None, norm_weight=x["norm_weight"],
                            backend=backend, **kw)


def chain(x, states, siso, T, backend):
    if backend == "reference":        # float64 on the CPU, same (rounded) inputs
        x = {n: None if t is None else t.detach().cpu().double() for n, t in x.items()}
        states = tuple(s.detach().cpu().double() for s in states)
    else:
        states = tuple(s.clone() for s in states)
    outs = torch.stack([run(x, states, siso, t, backend) for t in range(T)])
    return outs, states


SHAPES = [(P, N) for P in (16, 32, 64, 128) for N in (16, 64, 128, 256)]


@pytest.mark.parametrize("P,N", SHAPES, ids=[f"P{p}-N{n}" for p, n in SHAPES])
@pytest.mark.parametrize("mode", ["siso", "mimo4", "mimo8", "mimo2", "mimo2-norm", "mimo2-per-rank"])
def test_step_matches_float64_reference_fp32(P, N, mode):
    siso = mode == "siso"
    R = 1 if siso else int(mode[4])
    x, st = inputs(3, 24, 4, 2, P, N, R, torch.float32, siso, seed=P + N, per_rank="per-rank" in mode,
                   norm="norm" in mode)
    out, states = chain(x, st, siso, 24, "triton")
    ref, ref_states = chain(x, st, siso, 24, "reference")
    assert_rel_close("out", out, ref, 1e-5)
    for name, a, b in zip(("angle", "ssm", "k", "v"), states, ref_states):
        assert_rel_close(f"{name} state", a, b, 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("siso", [True, False], ids=["siso", "mimo4"])
def test_step_low_precision_inputs(dtype, siso):
    x, st = inputs(4, 16, 8, 1, 64, 128, 1 if siso else 4, dtype, siso, seed=7)
    out, states = chain(x, st, siso, 16, "triton")
    ref, ref_states = chain(x, st, siso, 16, "reference")
    assert out.dtype == dtype and states[1].dtype == torch.float32
    assert_rel_close("out", out, ref, 1e-2)
    assert_rel_close("ssm state", states[1], ref_states[1], 1e-5)


@pytest.mark.parametrize("P,N,R", [(16, 64, 2), (32, 64, 2), (48, 64, 2), (96, 64, 2), (48, 128, 4), (40, 256, 2)])
def test_no_out_of_bounds_writes_and_pooled_rows(P, N, R):
    """States live inside NaN-filled pools; only the addressed rows change, and nothing outside them (N ≥ 128: the
    lanes' sums, whole rows and N tiles)."""
    H = 4
    x, st = inputs(3, 4, H, 1, P, N, R, torch.float32, False, seed=P)
    pool = [torch.full((8,) + s.shape[1:], float("nan"), device=DEV, dtype=s.dtype) for s in st]
    idx = torch.tensor([6, -1, 1], device=DEV, dtype=torch.int32)
    valid = idx >= 0
    for p, s in zip(pool, st):
        p[idx[valid].long()] = s[valid]          # the padded slot (-1) has no state row
    rows = torch.tensor([6, 1], device=DEV)
    others = torch.tensor([0, 2, 3, 4, 5, 7], device=DEV)
    for t in range(4):
        out = run(x, pool, False, t, "triton", state_batch_indices=idx)
        assert torch.isfinite(out).all() and float(out[1].abs().max()) == 0.0
    for p in pool:
        assert torch.isnan(p[others]).all() and torch.isfinite(p[rows]).all()
    dense = [s.clone() for s in st]
    for t in range(4):
        run(x, dense, False, t, "triton")
    for p, d in zip(pool, dense):
        assert torch.equal(p[6], d[0]) and torch.equal(p[1], d[2])


@pytest.mark.parametrize("drop", ["z", "D", "z+D"])
@pytest.mark.parametrize("R,N,bsz,H", [(4, 128, 3, 4), (2, 256, 3, 4), (4, 128, 16, 64)],
                         ids=["R4-N128", "R2-N256", "R4-N128-large-batch"])
def test_lane_sums_without_optional_inputs(drop, R, N, bsz, H):
    """The lanes' output stage (MIMO R = 2 / 4 at N ≥ 128) without the gate (z, hence mimo_z) or D; at batch × heads
    ≥ 1024 one program streams eight 8-row tiles, each with its row inputs loaded a tile ahead (rows ≥ 40 masked)."""
    x, st = inputs(bsz, 5, H, 1, 40, N, R, torch.float32, False, seed=R + N)
    for name in drop.split("+"):
        x[name] = None
    out, states = chain(x, st, False, 5, "triton")
    ref, ref_states = chain(x, st, False, 5, "reference")
    assert_rel_close("out", out, ref, 1e-5)
    for name, a, b in zip(("angle", "ssm", "k", "v"), states, ref_states):
        assert_rel_close(f"{name} state", a, b, 1e-5)


def test_deterministic():
    x, st = inputs(8, 4, 8, 1, 64, 128, 4, torch.bfloat16, False, seed=9)
    a = chain(x, st, False, 4, "triton")
    b = chain(x, st, False, 4, "triton")
    assert torch.equal(a[0], b[0]) and all(torch.equal(u, v) for u, v in zip(a[1], b[1]))


@pytest.mark.parametrize("siso", [True, False], ids=["siso", "mimo4"])
def test_cuda_graph_capture_and_replay(siso):
    R = 1 if siso else 4
    x, st = inputs(4, 3, 8, 1, 64, 128, R, torch.bfloat16, siso, seed=11)
    pool = [torch.zeros((6,) + s.shape[1:], device=DEV, dtype=s.dtype) for s in st]
    idx = torch.tensor([3, 0, 5, 2], device=DEV)
    static = {n: (None if t is None else t[0].clone()) if n in ("q", "k", "v", "z", "adt", "dt", "trap", "angles")
              else t for n, t in x.items()}
    static1 = {n: (t[None] if n in ("q", "k", "v", "z", "adt", "dt", "trap", "angles") and t is not None else t)
               for n, t in static.items()}
    run(static1, pool, siso, 0, "triton", state_batch_indices=idx)          # compile outside the capture
    for p in pool:
        p.zero_()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(static1, pool, siso, 0, "triton", state_batch_indices=idx)
    eager_pool = [p.clone() for p in pool]
    for t in range(3):
        for n in ("q", "k", "v", "z", "adt", "dt", "trap", "angles"):
            static[n].copy_(x[n][t])
        idx.copy_(torch.tensor([2, 5, 0, 3][t % 4:] + [2, 5, 0, 3][:t % 4], device=DEV))
        graph.replay()
        want = run(static1, eager_pool, siso, 0, "triton", state_batch_indices=idx)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    for a, b in zip(pool, eager_pool):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_long_decode_keeps_angles_wrapped():
    x, st = inputs(2, 1, 4, 1, 16, 32, 1, torch.float32, True, seed=12)
    x["dt"] = x["dt"] * 0 + 0.5
    x["angles"] = x["angles"] * 0 + 3.0                   # ≈ 1.5 rad per token
    states = (st[0], st[1], st[2][:, 0], st[3])
    for _ in range(3000):
        mamba3_siso_step(x["q"][0][:, 0], x["k"][0][:, 0], x["v"][0], x["adt"][0], x["dt"][0], x["trap"][0],
                         x["q_bias"][:, 0], x["k_bias"][:, 0], x["angles"][0], x["D"], x["z"][0], states)
    assert (states[0] >= 0).all() and (states[0] < 2 * math.pi).all()


TILE_CONFIGS = [  # (block_p, block_n, num_warps, row_tiles): the benchmark's sweep (whole rows, streamed rows, N tiles)
    (bp, 128, w, rt) for bp, w in ((4, 1), (8, 1), (16, 1), (16, 2), (32, 2)) for rt in (1, 2, 4, 8, 16) if bp * rt <= 64
] + [(8, 32, 1, 1), (8, 64, 1, 1), (16, 64, 1, 1)]
# (siso, config, lane sums): every tile for both; MIMO's 8 × 128 one-warp tiles also with the lanes' sums; and
# programs that hold exactly P = 48 rows
TILE_CASES = [(siso, cfg, False) for siso in (True, False) for cfg in TILE_CONFIGS] + [
    (False, cfg, True) for cfg in TILE_CONFIGS + [(8, 128, 1, 6)] if cfg[:3] == (8, 128, 1)] + [
    (True, (16, 128, 1, 3), False), (False, (16, 128, 1, 3), False)]


@pytest.mark.parametrize("siso,cfg,lanes", TILE_CASES,
                         ids=[("siso-" if s else "mimo4-") + "x".join(map(str, c)) + ("-lanes" if ln else "")
                              for s, c, ln in TILE_CASES])
def test_every_swept_tile_config_matches_float64(siso, cfg, lanes):
    """Any tile the benchmark may recommend is exact: 6 chained tokens (the small states each step writes are read
    by the next), P = 48 and N = 96 (ragged row tiles and masked columns), pooled rows with a padded slot."""
    from mamba3.ops.step.configs import StepConfig
    from mamba3.ops.step.launch import step_triton
    from mamba3.ops.step.reference import step_reference

    config = StepConfig(block_p=cfg[0], block_n=cfg[1], num_warps=cfg[2], row_tiles=cfg[3], lane_sums=lanes)
    R = 1 if siso else 4
    x, st = inputs(3, 6, 4, 1, 48, 96, R, torch.float32, siso, seed=cfg[0] * 10 + cfg[3])
    idx = torch.tensor([2, -1, 0], device=DEV, dtype=torch.int32)
    names = ("q", "k", "v", "adt", "dt", "trap", "q_bias", "k_bias", "mimo_v", "mimo_z", "mimo_out", "angles", "D",
             "z")
    token = lambda d, t: [d[n][t] if n in ("q", "k", "v", "adt", "dt", "trap", "angles", "z") else d[n]
                          for n in names]
    states = [s.clone() for s in st]
    ref_x = {n: None if t is None else t.cpu().double() for n, t in x.items()}
    ref_states = [s.cpu().double() for s in st]
    for t in range(6):
        out = step_triton(*token(x, t), *states, idx, False, None, 1e-5, siso=siso, config=config)
        ref = step_reference(*token(ref_x, t), *ref_states, idx.cpu(), False, None, 1e-5,
                             pairing="adjacent" if siso else "half", siso=siso)
        assert_rel_close(f"out[{t}]", out, ref, 1e-5)
    for name, a, b in zip(("angle", "ssm", "k", "v"), states, ref_states):
        assert_rel_close(f"{name} state", a, b, 1e-5)


@pytest.mark.parametrize("siso", [True, False], ids=["siso", "mimo4"])
def test_large_batch_choice_matches_float64(siso):
    """batch × heads ≥ 1024: the dispatcher's MIMO choice is one program per (row, head) writing its small states."""
    x, st = inputs(16, 3, 64, 1, 64, 128, 1 if siso else 4, torch.float32, siso, seed=13)
    out, states = chain(x, st, siso, 3, "triton")
    ref, ref_states = chain(x, st, siso, 3, "reference")
    assert_rel_close("out", out, ref, 1e-5)
    for name, a, b in zip(("angle", "ssm", "k", "v"), states, ref_states):
        assert_rel_close(f"{name} state", a, b, 1e-5)
