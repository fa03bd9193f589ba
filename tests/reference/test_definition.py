"""The recurrent reference against a second, independent transcription of the paper's recurrence.

``scalar_loop`` below re-derives every piece (angle sum, pair rotation, biases, GQA mapping, trapezoid
weights, input states, D, gate, rank expansion, RMSNorm, contraction) with explicit loops over batch, head,
time and rank and 2×2 rotation matrices, sharing no code with mamba3.reference. Tiny shapes, float64.
"""
import math

import pytest
import torch

from mamba3.reference import mimo_recurrent, siso_recurrent
from mamba3.testing.inputs import float64_copy, mimo_inputs, siso_inputs


def _rot2(x, n0, n1, th):
    c, s = math.cos(th), math.sin(th)
    x = x.clone()
    a, b = x[n0].item(), x[n1].item()
    x[n0], x[n1] = a * c - b * s, a * s + b * c
    return x


def scalar_loop(a, mimo):
    q, k, v = a["q"], a["k"], a["v"]
    if not mimo:
        q, k = q[:, :, None], k[:, :, None]
    bsz, seqlen, rank, ngroups, dstate = q.shape
    nheads, headdim = v.shape[2], v.shape[3]
    angles = a["angles"]
    nangles = angles.shape[-1]
    qb = a["q_bias"] if mimo else a["q_bias"][:, None]
    kb = a["k_bias"] if mimo else a["k_bias"][:, None]
    states = a.get("input_states")
    out = torch.zeros(bsz, seqlen, rank, nheads, headdim, dtype=torch.float64)
    for b in range(bsz):
        for h in range(nheads):
            g = h // (nheads // ngroups)
            theta = [0.0] * nangles if states is None else states[0][b, h].tolist()
            hstate = torch.zeros(headdim, dstate, dtype=torch.float64) if states is None else states[1][b, h].clone()
            if states is None:
                k_prev = None
            else:
                k_prev = states[2][b, :, h] if mimo else states[2][b, h][None]
                v_prev = states[3][b, h]
            for t in range(seqlen):
                phi = angles[b, t, h] if angles.dim() == 4 else angles[b, t]
                dt = a["dt"][b, h, t].item()
                theta = [th + math.pi * math.tanh(p) * dt for th, p in zip(theta, phi.tolist())]
                lam = 1 / (1 + math.exp(-a["trap"][b, h, t].item()))
                alpha = math.exp(a["adt"][b, h, t].item())
                k_rot, q_rot = [], []
                for r in range(rank):
                    qq, kk = q[b, t, r, g] + qb[h, r], k[b, t, r, g] + kb[h, r]
                    for i, th in enumerate(theta):
                        n0, n1 = (i, i + dstate // 2) if mimo else (2 * i, 2 * i + 1)
                        qq, kk = _rot2(qq, n0, n1, th), _rot2(kk, n0, n1, th)
                    q_rot.append(qq)
                    k_rot.append(kk)
                psi = a["mimo_v"][h] if mimo else torch.ones(1, headdim, dtype=torch.float64)
                vt = v[b, t, h]
                new = hstate * alpha
                for r in range(rank):
                    new = new + lam * dt * torch.outer(vt * psi[r], k_rot[r])
                    if k_prev is not None:
                        new = new + (1 - lam) * dt * alpha * torch.outer(v_prev * psi[r], k_prev[r])
                hstate = new
                for r in range(rank):
                    y = hstate @ q_rot[r]
                    if a.get("D") is not None:
                        y = y + a["D"][h] * vt * psi[r]
                    out[b, t, r, h] = y
                k_prev, v_prev = torch.stack(k_rot), vt
    if not mimo:
        out = out[:, :, 0]
        if a.get("z") is not None:
            z = a["z"]
            out = out * z * torch.sigmoid(z)
        return out
    if a.get("rms_norm"):
        out = out / torch.sqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * a["norm_weight"]
    if a.get("z") is not None:
        zr = a["z"][:, :, None] * a["mimo_z"].permute(1, 0, 2)
        out = out * zr * torch.sigmoid(zr)
    if a.get("mimo_out") is not None:
        out = (out * a["mimo_out"].permute(1, 0, 2)).sum(2)
    return out


@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_siso_recurrent_is_the_definition(states, shared):
    a = float64_copy(siso_inputs(bsz=2, seqlen=6, nheads=4, ngroups=2, dstate=8, headdim=4, nangles=3,
                                 states=states, shared_angles=shared, seed=1))
    out, _ = siso_recurrent(**a)
    err = ((out - scalar_loop(a, mimo=False)).norm() / out.norm()).item()
    assert err < 1e-13, f"relative Frobenius error {err:.3e}"


@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("variant", ["contract", "per_rank", "rms_norm"])
def test_mimo_recurrent_is_the_definition(states, variant):
    a = float64_copy(mimo_inputs(bsz=1, seqlen=5, nheads=2, ngroups=1, dstate=8, headdim=4, rank=3, nangles=2,
                                 states=states, with_out=variant != "per_rank", rms_norm=variant == "rms_norm",
                                 seed=2))
    out, _ = mimo_recurrent(**a)
    err = ((out - scalar_loop(a, mimo=True)).norm() / out.norm()).item()
    assert err < 1e-13, f"relative Frobenius error {err:.3e}"


def test_final_angle_is_wrapped_and_rotation_pairs_are_the_official_ones():
    a = float64_copy(siso_inputs(seqlen=50, dstate=8, nangles=4, seed=3))
    a["dt"] = a["dt"] * 50                 # angles travel several turns
    _, (angle, _, k_last, _) = siso_recurrent(**a)
    assert angle.min() >= 0 and angle.max() < 2 * math.pi
    # Adjacent pairs for SISO: the norm of each pair (2i, 2i+1) of k̃ equals that of the biased k.
    kb = a["k"][:, -1].repeat_interleave(2, dim=1) + a["k_bias"]
    pair_norm = lambda x: x.unflatten(-1, (-1, 2)).norm(dim=-1)
    torch.testing.assert_close(pair_norm(k_last), pair_norm(kb), rtol=1e-12, atol=1e-12)
