"""mamba3.ops.common kernels under the interpreter: chunk sums + float64 angle offsets, state passing
(forward and reverse, dense and varlen), against plain float64 torch."""
import math

import pytest
import torch

from mamba3.testing.errors import rel_frobenius


def _chunks(B, T, C, cu):
    from mamba3.ops.common.chunking import make_chunks

    return make_chunks(B, T, C, None if cu is None else torch.tensor(cu), "cpu")


def test_chunk_tables_are_cached_and_usable_after_inference_mode():
    """make_chunks returns the cached tables for the same shape (or cu_seqlens values) and chunk, and tables first
    made under torch.inference_mode() can index an op autograd records later (their tensors are normal tensors)."""
    from mamba3.ops.common.chunking import make_chunks

    with torch.inference_mode():
        first = make_chunks(3, 77, 16, None, "cpu")
    assert make_chunks(3, 77, 16, None, "cpu") is first
    assert make_chunks(3, 77, 32, None, "cpu") is not first
    assert make_chunks(1, 9, 4, torch.tensor([0, 4, 9]), "cpu") is make_chunks(1, 9, 4, torch.tensor([0, 4, 9]), "cpu")
    x = torch.randn(3, 2, 77, requires_grad=True)
    x[first.seq_bidx, :, first.seq_start_tok].sum().backward()
    assert x.grad[:, :, 0].eq(1).all() and x.grad[:, :, 1:].eq(0).all()


def _increments(ang, dt, B, T, H):
    """π·tanh(φ)·dt per (token, head, angle), float64 (B, T, H, A); shared angles (B, T, A) broadcast over heads."""
    phi = ang.double() if ang.dim() == 4 else ang.double()[:, :, None, :].expand(B, T, H, ang.shape[-1])
    return math.pi * torch.tanh(phi) * dt.double().transpose(1, 2)[..., None]


@pytest.mark.parametrize("cu", [None, [0, 3, 40, 41]])
@pytest.mark.parametrize("shared", [False, True])
def test_chunk_sums_and_angle_offsets(cu, shared):
    from mamba3.ops.common.cumsum import angle_offsets, chunk_sums

    g = torch.Generator().manual_seed(0)
    B, T, H, A, C = (2, 41, 3, 5, 16) if cu is None else (1, 41, 3, 5, 16)
    adt = -torch.rand(B, H, T, generator=g)
    dt = torch.rand(B, H, T, generator=g)
    ang = torch.randn((B, T, A) if shared else (B, T, H, A), generator=g)
    ch = _chunks(B, T, C, cu)
    state = torch.rand(ch.nseq, H, A, generator=g) * 6
    trap = torch.randn(B, H, T, generator=g)
    gsum, asum, coef = chunk_sums(adt, dt, trap, ang, ch, H, A)
    off, final = angle_offsets(asum, ch, state)
    lam = torch.sigmoid(trap.double())
    gamma = lam * dt.double()
    inc = _increments(ang, dt, B, T, H)  # (B, T, H, A)
    tab = ch.chunk_table.long()
    for c in range(ch.nchunks):
        b, t0, L, s, _ = tab[c].tolist()
        start = 0 if cu is None else cu[s]
        assert torch.allclose(gsum[c].double(), adt[b, :, t0:t0 + L].double().sum(-1), atol=1e-5)
        # the per-token table: within-chunk cumsum of adt, γ = σ(trap)·dt, scale = γ + dt'(1 − σ(trap')) of the
        # next token of the same sequence (γ alone at its last token)
        end = T if cu is None else cu[s + 1]
        nxt = torch.zeros(H, L, dtype=torch.float64)
        inside = min(t0 + L + 1, end) - (t0 + 1)
        nxt[:, :inside] = (dt.double() * (1 - lam))[b, :, t0 + 1:t0 + 1 + inside]
        torch.testing.assert_close(coef[0, b, :, t0:t0 + L].double(), adt[b, :, t0:t0 + L].double().cumsum(-1),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(coef[1, b, :, t0:t0 + L].double(), gamma[b, :, t0:t0 + L], atol=1e-6, rtol=0)
        torch.testing.assert_close(coef[2, b, :, t0:t0 + L].double(), gamma[b, :, t0:t0 + L] + nxt, atol=1e-6,
                                   rtol=0)
        want = torch.remainder(state[s].double() + inc[b, start:t0].sum(0), 2 * math.pi)
        d = torch.remainder(off[c].double() - want + math.pi, 2 * math.pi) - math.pi
        assert d.abs().max() < 1e-5, (c, d.abs().max())
    for s in range(ch.nseq):
        b = 0 if cu is None else 0
        lo, hi = (0, T) if cu is None else (cu[s], cu[s + 1])
        bb = s if cu is None else 0
        want = torch.remainder(state[s].double() + inc[bb, lo:hi].sum(0), 2 * math.pi)
        d = torch.remainder(final[s] - want + math.pi, 2 * math.pi) - math.pi
        assert d.abs().max() < 1e-5


def _theta_reference(ang, dt, state, cu, B, T, H):
    """θ (B, T, H, A) float64, unwrapped: the angle state plus the running sum over each sequence."""
    inc = _increments(ang, dt, B, T, H)
    theta = torch.empty_like(inc)
    bounds = [(b, 0, T) for b in range(B)] if cu is None else [(0, cu[s], cu[s + 1]) for s in range(len(cu) - 1)]
    for s, (b, lo, hi) in enumerate(bounds):
        theta[b, lo:hi] = state[s].double() + inc[b, lo:hi].cumsum(0)
    return theta


def _angle_distance(x, want):
    return (torch.remainder(x.double() - want + math.pi, 2 * math.pi) - math.pi).abs().max()


@pytest.mark.parametrize("cu", [None, [0, 3, 70, 71, 150]])
@pytest.mark.parametrize("shared", [False, True])
def test_rotation_planes_and_angle_cumsum(cu, shared):
    """The per-token rotation (SISO's sin/cos planes, MIMO's θ mod 2π) over chunks of 64 tokens, ragged chunks and
    ragged column blocks included (H·A = 3·45 columns, two blocks of 128), against float64 running sums."""
    from mamba3.ops.common.cumsum import angle_cumsum, angle_offsets, chunk_sums, rotation_planes

    g = torch.Generator().manual_seed(1)
    B, T, H, A, C = (2, 150, 3, 45, 64) if cu is None else (1, 150, 3, 45, 64)
    # dt ≤ 0.1 (as the layer's dt_max): a chunk's running sum stays within ~20 rad, where fp32 resolves 2e-6
    dt = 0.1 * torch.rand(B, H, T, generator=g)
    ang = torch.randn((B, T, A) if shared else (B, T, H, A), generator=g)
    ch = _chunks(B, T, C, cu)
    state = torch.rand(ch.nseq, H, A, generator=g) * 6
    want = _theta_reference(ang, dt, state, cu, B, T, H)
    _, asum, _ = chunk_sums(-torch.rand(B, H, T, generator=g), dt, torch.randn(B, H, T, generator=g), ang, ch, H, A)
    off, _ = angle_offsets(asum, ch, state)
    rot, plane = rotation_planes(ang, dt, off, ch, H, A)
    assert plane == B * T * H * A
    torch.testing.assert_close(rot[0].double(), torch.sin(want), atol=2e-6, rtol=0)
    torch.testing.assert_close(rot[1].double(), torch.cos(want), atol=2e-6, rtol=0)
    theta, final = angle_cumsum(ang, dt, ch, H, A, state)
    assert theta.shape == (B, T, H, A) and theta.dtype == torch.float32
    assert theta.min() >= 0 and theta.max() < 2 * math.pi
    assert _angle_distance(theta, want) < 2e-6
    last = [(b, T - 1) for b in range(B)] if cu is None else [(0, e - 1) for e in cu[1:]]
    for s, (b, t) in enumerate(last):
        assert _angle_distance(final[s], want[b, t]) < 2e-6


@pytest.mark.parametrize("cu", [None, [0, 3, 70, 71, 150]])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("H, A", [(3, 5), (20, 33)])
def test_angle_backward(cu, shared, H, A):
    """angle_backward against float64 autograd through the running sums: R = dL/dθ_t per token plus a final
    angle gradient per sequence, ragged chunks included; (20, 33): three blocks of 8 heads × 64 angles, the last
    one ragged (shared angles: three slabs summed)."""
    from mamba3.ops.common.cumsum import angle_backward

    g = torch.Generator().manual_seed(2)
    B, T, C = (2, 150, 64) if cu is None else (1, 150, 64)
    ch = _chunks(B, T, C, cu)
    dt = 0.1 * torch.rand(B, H, T, generator=g)
    ang = torch.randn((B, T, A) if shared else (B, T, H, A), generator=g)
    R = torch.randn(B, T, H, A, generator=g)
    dfinal = torch.randn(ch.nseq, H, A, generator=g)
    dang, ddt, dstate = angle_backward(R, dfinal, ang, dt, ch, H, A)

    ang64 = ang.double().requires_grad_()
    dt64 = dt.double().requires_grad_()
    state = torch.zeros(ch.nseq, H, A, dtype=torch.float64, requires_grad=True)
    theta = _theta_reference(ang64, dt64, state, cu, B, T, H)
    last = [(b, T - 1) for b in range(B)] if cu is None else [(0, e - 1) for e in cu[1:]]
    final = torch.stack([theta[b, t] for b, t in last])
    loss = (theta * R.double()).sum() + (final * dfinal.double()).sum()
    want_ang, want_dt, want_state = torch.autograd.grad(loss, (ang64, dt64, state))
    for name, got, want in (("dangles", dang, want_ang), ("ddt", ddt, want_dt), ("dstate", dstate, want_state)):
        err = rel_frobenius(got, want)
        assert err < 1e-6, f"{name}: relative Frobenius error {err:.3e}"


@pytest.mark.parametrize("cu", [None, [0, 20, 21, 50]])
@pytest.mark.parametrize("reverse", [False, True])
def test_state_passing(cu, reverse):
    from mamba3.ops.common.state_passing import state_passing

    B, T, C, H, PN = (2, 50, 16, 2, 24) if cu is None else (1, 50, 16, 2, 24)
    ch = _chunks(B, T, C, cu)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(ch.nchunks, H, PN, generator=g)
    gs = -torch.rand(ch.nchunks, H, generator=g)
    init = torch.randn(ch.nseq, H, PN, generator=g)
    final = torch.empty_like(init)
    X0 = X.clone()
    state_passing(X, gs, ch.seq_table, ch.max_chunks, init=init, final=final, reverse=reverse, block=16)
    for s in range(ch.nseq):
        first, n = ch.seq_table[s].tolist()
        order = range(first, first + n)
        order = reversed(order) if reverse else order
        x = init[s].double()
        for c in order:
            assert torch.allclose(X[c].double(), x, atol=1e-5)
            x = math.e ** 0 * torch.exp(gs[c].double())[:, None] * x + X0[c].double()
        assert torch.allclose(final[s].double(), x, atol=1e-5)


@pytest.mark.parametrize("cu", [None, [0, 20, 21, 50]])
def test_state_passing_into_16bit_copy_with_partials(cu):
    """``out`` (the carried states rounded into a bf16 buffer, the local terms left in place) and ``kend`` (the
    reverse pass's e^{g[c]}·⟨dS leaving c, S entering c⟩ per slab, and S rounded into its own bf16 buffer) against
    a float64 walk; PN = 24 at block 16 leaves the second slab half masked."""
    from mamba3.ops.common.state_passing import state_passing, state_slabs

    B, T, C, H, PN = (2, 50, 16, 2, 24) if cu is None else (1, 50, 16, 2, 24)
    ch = _chunks(B, T, C, cu)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(ch.nchunks, H, PN, generator=g)
    S = torch.randn(ch.nchunks, H, PN, generator=g)
    gs = -torch.rand(ch.nchunks, H, generator=g)
    X0 = X.clone()
    out, s16 = torch.empty_like(X, dtype=torch.bfloat16), torch.empty_like(S, dtype=torch.bfloat16)
    parts = torch.full((state_slabs(PN, 16), ch.nchunks, H), float("nan"))
    state_passing(X, gs, ch.seq_table, ch.max_chunks, reverse=True, block=16, out=out, kend=(S, s16, parts))
    assert torch.equal(X, X0), "the local terms must stay in X"
    assert torch.equal(s16, S.to(torch.bfloat16))
    for s in range(ch.nseq):
        first, n = ch.seq_table[s].tolist()
        x = torch.zeros(H, PN, dtype=torch.float64)
        for c in reversed(range(first, first + n)):
            torch.testing.assert_close(out[c].double(), x, rtol=4e-3, atol=1e-6)  # bf16 rounding
            want = torch.exp(gs[c].double()) * (x * S[c].double()).sum(-1)
            assert torch.allclose(parts[:, c].double().sum(0), want, atol=1e-5), c
            x = torch.exp(gs[c].double())[:, None] * x + X0[c].double()
