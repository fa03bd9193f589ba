"""The Mamba3 layer: official state-dict layout, the block against a from-scratch float64 computation, decoding
(step, prefill in pieces, pooled caches) against the chunked forward, varlen, backward. CPU, reference backend."""
import math

import pytest
import torch
import torch.nn.functional as F

from mamba3.modules import InferenceParams, Mamba3
from mamba3.testing.errors import assert_rel_close

D_MODEL, D_STATE, HEADDIM, EXPAND = 32, 16, 8, 2


def official_layout(d_model, d_state, expand, headdim, ngroups, rope_fraction, is_mimo, mimo_rank,
                    is_outproj_norm):
    """Parameter names and shapes of mamba_ssm.modules.mamba3.Mamba3 (written from the spec, not the module)."""
    d_inner = expand * d_model
    H = d_inner // headdim
    R = mimo_rank if is_mimo else 1
    A = (int(d_state * rope_fraction) // 2 * 2) // 2
    d_in_proj = 2 * d_inner + 2 * d_state * ngroups * R + 3 * H + A
    layout = {"in_proj.weight": (d_in_proj, d_model), "dt_bias": (H,), "B_norm.weight": (d_state,),
              "C_norm.weight": (d_state,), "B_bias": (H, R, d_state), "C_bias": (H, R, d_state), "D": (H,),
              "out_proj.weight": (d_model, d_inner)}
    if is_mimo:
        layout.update({"mimo_x": (H, R, headdim), "mimo_z": (H, R, headdim), "mimo_o": (H, R, headdim)})
    if is_outproj_norm:
        layout["norm.weight"] = (d_inner,)
    return layout


def random_state_dict(layout, seed):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in layout.items():
        x = torch.randn(shape, generator=g)
        if name == "in_proj.weight":
            x = x / math.sqrt(shape[1])
        elif name == "out_proj.weight":
            x = x / math.sqrt(shape[1])
        elif name == "dt_bias":
            x = torch.log(torch.expm1(torch.empty(shape).uniform_(1e-3, 1e-1, generator=g)))
        else:
            x = 1.0 + 0.2 * x
        sd[name] = x
    return sd


def block_float64(sd, u, *, d_state, headdim, ngroups, rope_fraction, is_mimo, mimo_rank, is_outproj_norm,
                  A_floor=1e-4, a_activation="heavy_tail"):
    """The Mamba-3 block from the spec, token by token in float64, from the state dict alone."""
    sd = {k: v.double() for k, v in sd.items()}
    u = u.double()
    Bsz, T, _ = u.shape
    d_inner = sd["out_proj.weight"].shape[1]
    H, P, N, G = d_inner // headdim, headdim, d_state, ngroups
    R = mimo_rank if is_mimo else 1
    A_n = (int(N * rope_fraction) // 2 * 2) // 2
    proj = u @ sd["in_proj.weight"].T
    z, x, Bp, Cp, dd_dt, dd_A, trap, ang = torch.split(
        proj, [d_inner, d_inner, N * G * R, N * G * R, H, H, H, A_n], dim=-1)

    def rms(v, w):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-5) * w

    Bp = rms(Bp.reshape(Bsz, T, R, G, N), sd["B_norm.weight"])
    Cp = rms(Cp.reshape(Bsz, T, R, G, N), sd["C_norm.weight"])
    if a_activation == "softplus":
        ht = torch.log1p(torch.exp(dd_A))
    else:
        ht = torch.where(dd_A >= 0, 1 + dd_A, 1 / (1 - dd_A.clamp(max=0)))
    A = torch.minimum(-ht, torch.tensor(-A_floor, dtype=torch.float64))
    DT = F.softplus(dd_dt + sd["dt_bias"])
    lam = torch.sigmoid(trap)
    out = torch.zeros(Bsz, T, H, P, dtype=torch.float64)
    for b in range(Bsz):
        for h in range(H):
            g = h // (H // G)
            S = torch.zeros(P, N, dtype=torch.float64)
            theta = torch.zeros(A_n, dtype=torch.float64)
            kprev = [torch.zeros(N, dtype=torch.float64) for _ in range(R)]
            vprev = torch.zeros(P, dtype=torch.float64)
            for t in range(T):
                theta = theta + math.pi * torch.tanh(ang[b, t]) * DT[b, t, h]

                def rot(vec):
                    o = vec.clone()
                    for i in range(A_n):
                        c, s = math.cos(theta[i]), math.sin(theta[i])
                        i0, i1 = (2 * i, 2 * i + 1) if not is_mimo else (i, i + N // 2)
                        o[i0] = vec[i0] * c - vec[i1] * s
                        o[i1] = vec[i0] * s + vec[i1] * c
                    return o

                alpha = math.exp(A[b, t, h] * DT[b, t, h])
                gamma = lam[b, t, h] * DT[b, t, h]
                beta = (1 - lam[b, t, h]) * DT[b, t, h] * alpha
                xv = x[b, t, h * P:(h + 1) * P]
                psi = sd["mimo_x"][h] if is_mimo else torch.ones(R, P, dtype=torch.float64)
                ks = [rot(Bp[b, t, r, g] + sd["B_bias"][h, r]) for r in range(R)]
                qs = [rot(Cp[b, t, r, g] + sd["C_bias"][h, r]) for r in range(R)]
                S = alpha * S
                for r in range(R):
                    S = S + beta * torch.outer(vprev * psi[r], kprev[r]) + gamma * torch.outer(xv * psi[r], ks[r])
                zh = z[b, t, h * P:(h + 1) * P]
                acc = torch.zeros(P, dtype=torch.float64)
                for r in range(R):
                    y = S @ qs[r] + sd["D"][h] * xv * psi[r]
                    if is_mimo:
                        if is_outproj_norm:
                            y = rms(y, sd["norm.weight"][h * P:(h + 1) * P])
                        zr = zh * sd["mimo_z"][h, r]
                        acc = acc + sd["mimo_o"][h, r] * y * zr * torch.sigmoid(zr)
                    elif is_outproj_norm:
                        acc = rms(y, sd["norm.weight"][h * P:(h + 1) * P]) * zh * torch.sigmoid(zh)
                    else:
                        acc = y * zh * torch.sigmoid(zh)
                out[b, t, h] = acc
                kprev, vprev = ks, xv
    return out.reshape(Bsz, T, d_inner) @ sd["out_proj.weight"].T


CONFIGS = [
    dict(is_mimo=False, is_outproj_norm=False, ngroups=1, rope_fraction=0.5),
    dict(is_mimo=False, is_outproj_norm=True, ngroups=2, rope_fraction=1.0),
    dict(is_mimo=True, is_outproj_norm=False, ngroups=1, rope_fraction=0.5),
    dict(is_mimo=True, is_outproj_norm=True, ngroups=2, rope_fraction=1.0),
]
IDS = ["siso", "siso-norm-gqa-rope1", "mimo", "mimo-norm-gqa-rope1"]


def make_layer(cfg, seed=0, rank=2, dtype=None, **kw):
    torch.manual_seed(seed)
    return Mamba3(D_MODEL, d_state=D_STATE, expand=EXPAND, headdim=HEADDIM, mimo_rank=rank, layer_idx=0,
                  dtype=dtype, **cfg, **kw)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_official_state_dict_loads_and_matches_float64_block(cfg):
    rank = 2
    layout = official_layout(D_MODEL, D_STATE, EXPAND, HEADDIM, cfg["ngroups"], cfg["rope_fraction"],
                             cfg["is_mimo"], rank, cfg["is_outproj_norm"])
    layer = make_layer(cfg, rank=rank)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == layout
    sd = random_state_dict(layout, seed=3)
    layer.load_state_dict(sd, strict=True)
    u = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(4))
    ref = block_float64(sd, u, d_state=D_STATE, headdim=HEADDIM, mimo_rank=rank, **cfg)
    assert_rel_close("layer fp32", layer(u), ref, 1e-5)
    layer64 = make_layer(cfg, rank=rank, dtype=torch.float64)
    layer64.load_state_dict(sd)
    assert_rel_close("layer fp64", layer64(u.double()), ref, 1e-12)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]], ids=[IDS[0], IDS[2]])
def test_softplus_a_matches_float64_block(cfg):
    """a_activation="softplus" (A = −softplus(dd_A), the official module's earlier form) against the float64 spec;
    dd_A spread wide, so the two activations differ (by 0.3 at dd_A = 0, ever more for dd_A ≪ 0)."""
    layout = official_layout(D_MODEL, D_STATE, EXPAND, HEADDIM, cfg["ngroups"], cfg["rope_fraction"],
                             cfg["is_mimo"], 2, cfg["is_outproj_norm"])
    layer = make_layer(cfg, a_activation="softplus")
    sd = random_state_dict(layout, seed=5)
    dd_A = layer.in_proj_slices()["dd_A"]
    sd["in_proj.weight"][dd_A] *= 8.0
    layer.load_state_dict(sd, strict=True)
    u = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(6))
    ref = block_float64(sd, u, d_state=D_STATE, headdim=HEADDIM, mimo_rank=2, a_activation="softplus", **cfg)
    assert_rel_close("layer fp32, softplus A", layer(u), ref, 1e-5)
    other = block_float64(sd, u, d_state=D_STATE, headdim=HEADDIM, mimo_rank=2, **cfg)
    assert (other - ref).norm() > 1e-2 * ref.norm()  # the option changes the output
    with pytest.raises(ValueError, match="a_activation"):
        make_layer(cfg, a_activation="exp")


def test_initialisation_follows_the_official_formulas():
    layer = Mamba3(64, d_state=32, headdim=16, is_mimo=True, mimo_rank=4, dt_min=0.001, dt_max=0.1)
    H, R = layer.nheads, 4
    assert layer.num_rope_angles == 32 // 4
    assert torch.equal(layer.D, torch.ones(H))
    assert torch.equal(layer.B_bias, torch.ones(H, R, 32)) and torch.equal(layer.C_bias, torch.ones(H, R, 32))
    assert torch.allclose(layer.mimo_x, torch.full((H, R, 16), 0.25))
    assert torch.equal(layer.mimo_z, torch.ones(H, R, 16))
    assert torch.allclose(layer.mimo_o, torch.full((H, R, 16), 0.25))
    dt = F.softplus(layer.dt_bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    assert layer.dt_bias._no_weight_decay and layer.D._no_weight_decay
    assert Mamba3(64, d_state=32, rope_fraction=1.0, headdim=16).num_rope_angles == 16


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_token_by_token_decoding_equals_the_chunked_forward(cfg):
    layer = make_layer(cfg)
    u = torch.randn(3, 13, D_MODEL, generator=torch.Generator().manual_seed(5))
    full, final = layer._chunked(u, None, None, True)
    cache = layer.allocate_inference_cache(3, 13)
    with torch.no_grad():
        steps = torch.cat([layer.step(u[:, t:t + 1], cache) for t in range(13)], dim=1)
    assert_rel_close("decoded outputs", steps, full, 1e-5)
    for name, got, want in zip(("angle", "ssm", "k", "v"), layer._op_states(cache), final):
        assert_rel_close(f"{name} state", got, want, 1e-5)
    assert (cache.angle >= 0).all() and (cache.angle < 2 * math.pi).all()
    # (B, d_model) input works too
    cache2 = layer.allocate_inference_cache(3, 1)
    with torch.no_grad():
        assert_rel_close("2-D step", layer.step(u[:, 0], cache2), full[:, 0], 1e-5)


@pytest.mark.parametrize("cfg", CONFIGS[::2], ids=IDS[::2])
def test_prefill_in_pieces_and_inference_params_equal_one_pass(cfg):
    layer = make_layer(cfg)
    u = torch.randn(2, 20, D_MODEL, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = layer(u)
        params = InferenceParams(max_seqlen=20, max_batch_size=2)
        pieces = []
        for s, e in ((0, 7), (7, 8), (8, 15), (15, 16), (16, 20)):      # chunked, one-token steps, chunked
            pieces.append(layer(u[:, s:e], inference_params=params))
            params.seqlen_offset += e - s
    assert_rel_close("pieces", torch.cat(pieces, dim=1), full, 1e-5)


@pytest.mark.parametrize("cfg", CONFIGS[::2], ids=IDS[::2])
def test_varlen_matches_separate_sequences_and_fills_the_cache(cfg):
    layer = make_layer(cfg)
    lens = [5, 1, 9]
    us = [torch.randn(1, n, D_MODEL, generator=torch.Generator().manual_seed(10 + i)) for i, n in enumerate(lens)]
    cu = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    with torch.no_grad():
        params = InferenceParams(max_seqlen=16, max_batch_size=3)
        packed = layer(torch.cat(us, dim=1), cu_seqlens=cu, inference_params=params)
        sep = torch.cat([layer(x) for x in us], dim=1)
        assert_rel_close("varlen", packed, sep, 1e-5)
        seq_idx = torch.repeat_interleave(torch.arange(3), torch.tensor(lens))[None]
        assert_rel_close("seq_idx", layer(torch.cat(us, dim=1), seq_idx=seq_idx), sep, 1e-5)
        # the cache now holds each sequence's final state: one more token per sequence
        nxt = torch.randn(3, 1, D_MODEL, generator=torch.Generator().manual_seed(20))
        params.seqlen_offset = 1
        stepped = layer(nxt, inference_params=params)
        for i, x in enumerate(us):
            want = layer(torch.cat([x, nxt[i:i + 1]], dim=1))[:, -1:]
            assert_rel_close(f"continue seq {i}", stepped[i:i + 1], want, 1e-5)


@pytest.mark.parametrize("cfg", CONFIGS[::2], ids=IDS[::2])
def test_pooled_cache_with_state_batch_indices(cfg):
    layer = make_layer(cfg)
    u = torch.randn(3, 6, D_MODEL, generator=torch.Generator().manual_seed(7))
    full = layer(u)
    pool = layer.allocate_inference_cache(6, 6)
    slots = torch.tensor([4, 0, 2])
    pad_slot = torch.tensor([-1])
    with torch.no_grad():
        outs = []
        for t in range(6):
            # a padded row (-1) in the batch must not touch any slot
            uu = torch.cat([u[:, t], torch.randn(1, D_MODEL)], dim=0)
            o = layer.step(uu, pool, state_batch_indices=torch.cat([slots, pad_slot]))
            assert torch.equal(o[3], torch.zeros_like(o[3]))
            outs.append(o[:3])
    assert_rel_close("pooled", torch.stack(outs, dim=1), full, 1e-5)
    for s in (1, 3, 5):
        assert all(float(x[s].abs().max()) == 0.0 for x in pool)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_backward_gives_finite_gradients_for_every_parameter(cfg):
    layer = make_layer(cfg)
    u = torch.randn(1, 11, D_MODEL, requires_grad=True)
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    layer(u, cu_seqlens=cu).square().sum().backward()
    assert torch.isfinite(u.grad).all()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("save", [False, True])
@pytest.mark.parametrize("op, cfg, layer_flag, op_flag", [("mamba3_mimo", CONFIGS[2], "mimo_save_y", "save_y"),
                                                          ("mamba3_siso", CONFIGS[0], "siso_save_states",
                                                           "save_states")], ids=["mimo", "siso"])
def test_save_for_backward_flags_reach_the_operator(op, cfg, layer_flag, op_flag, save, monkeypatch):
    """``Mamba3(mimo_save_y=True)`` / ``Mamba3(siso_save_states=True)`` ask the eager operator to keep y / the
    16-bit chunk states for its backward (and only then); the output is the same either way (the reference backend
    here has nothing to keep)."""
    from mamba3.modules import mamba3_layer

    seen = []
    eager = getattr(mamba3_layer, op)
    monkeypatch.setattr(mamba3_layer, op, lambda *a, **kw: seen.append(kw.get(op_flag)) or eager(*a, **kw))
    u = torch.randn(1, 7, D_MODEL)
    y = make_layer(cfg, **{layer_flag: save})(u)
    assert seen == [True if save else None]
    assert_rel_close("output", y, make_layer(cfg)(u), 1e-6)


def test_single_token_forward_and_bf16():
    layer = make_layer(CONFIGS[2], dtype=torch.bfloat16)          # MIMO with T = 1 (official issue #985)
    u = torch.randn(2, 1, D_MODEL, dtype=torch.bfloat16)
    y = layer(u)
    assert y.shape == (2, 1, D_MODEL) and y.dtype == torch.bfloat16
    cache = layer.allocate_inference_cache(2, 4)
    assert cache.ssm.dtype == cache.angle.dtype == cache.k.dtype == torch.float32 and cache.v.dtype == torch.bfloat16
    with torch.no_grad():
        assert_rel_close("bf16 step", layer.step(u, cache), y, 2e-2)


def test_step_rejects_several_tokens():
    layer = make_layer(CONFIGS[0])
    with pytest.raises(ValueError, match="one token"):
        layer.step(torch.randn(2, 3, D_MODEL), layer.allocate_inference_cache(2, 3))
