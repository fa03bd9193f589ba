"""``mimo_triton``: the MIMO Mamba-3 operator on the Triton kernels, differentiable w.r.t. every input.

Split of the work:
- the angle cumsum θ (TT, H, A) fp32, wrapped mod 2π: the chunk-parallel kernels SISO uses
  (``common.cumsum``), behind their own autograd Function (:mod:`.angles`);
- sin θ and cos θ as fp32 planes (TT, H, 2, A), computed once per pass by PyTorch and loaded by the kernels;
- cheap per-token preparation in PyTorch (autograd-differentiable, O(T·H) elements): the in-chunk log-decay
  cumsum c (float64 running sum, stored fp32; its own autograd Function, ``_ChunkCumsum``), γ and scale, the
  folded input state S_0 = ssm_in + (1−λ_0)·dt_0·Σ_r ṽ_in k̃_inᵀ, and the final k/v/angle states (gathered at the
  last tokens);
- everything O(T·H·R·(N+P)) or larger in the kernels, behind one ``torch.autograd.Function`` (``_MimoCore``)
  whose backward returns the gradients of θ, c, γ, scale and S_0, which autograd carries back to angles, dt,
  adt, trap and the input states.

Tiling: the dispatcher's configuration fixes BM rows = (token, rank) pairs per tile; ``chunk_size`` only caps
the tile's tokens (the math does not depend on it). fp32 inputs use tf32x3 dots (fp32-accurate) unless
precision="tf32"; bf16/fp16 inputs use tf32 dots on fp32 operands, except for the forward's token-by-token
dots, whose operands are rounded to the input's 16-bit type (and the dq/dk/dv kernels' dots where the
configuration sets ``bwd_dots16``: P = 64's, over 64-column N-pair blocks). Where the grid of (P block, sequence,
head) programs fills the GPU, the forward runs as one scan per program with the state in registers, and the
backward's two state passes likewise (``configs.for_grid``).
"""
from __future__ import annotations

import dataclasses

import torch

from . import launch as _launch
from ..checks import on_device_of
from ..common.chunking import make_chunks
from ..common.replay import replaying_for_gradients
from .angles import ANGLE_CHUNK, MimoAngles
from .configs import MimoProblem, block_p, choose_config, for_grid, scan_block_p


def _device_spec(device):
    from mamba3.dispatch import arch_spec, device_spec

    if device.type == "cuda":
        return device_spec(device)
    return arch_spec(89)  # interpreter lane: choose as for the smallest-memory architecture


def _rotation_planes(theta):
    """sin θ and cos θ (fp32) of every token, head and angle, side by side: (TT, H, 2, A) from θ (TT, H, A).
    Computed once per pass (twice per forward+backward) and loaded by every kernel that rotates q or k, where each
    tile used to evaluate sin/cos itself (≈ a quarter of the MIMO output kernel's instructions, sm_90 SASS)."""
    TT, H, A = theta.shape
    rot = torch.empty(TT, H, 2, A, device=theta.device, dtype=torch.float32)
    torch.sin(theta, out=rot[:, :, 0])
    torch.cos(theta, out=rot[:, :, 1])
    return rot


def _pass_tensors(L, norm, q, k, v, theta, cs, gam, scl, qb, kb, psi, zeta, phi, D, z, nw, s0, chunked=True):
    """What the launchers of one pass (forward, or the backward with its forward recompute) read, with the
    tensors derived once per pass: the rotation planes and, for the chunked passes' state passing, the state
    chunks' decays (``chunked=False``: the scan forward, which has no use for them)."""
    return dict(q=q, k=k, v=v, rot=_rotation_planes(theta), cs=cs,
                decay=_launch.chunk_decays(L, cs) if chunked else None, gam=gam, scl=scl, qb=qb, kb=kb, psi=psi,
                zeta=zeta, phi=phi, D=D, z=z, nw=nw, s0=s0, norm=norm)


class _MimoCore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, L, flags, q, k, v, theta, cs, gam, scl, qb, kb, psi, zeta, phi, D, z, nw, s0):
        ctx.L = L
        ctx.flags = flags
        if replaying_for_gradients():  # neither value is read by a gradient formula (common.replay)
            ctx.save_for_backward(q, k, v, theta, cs, gam, scl, qb, kb, psi, zeta, phi, D, z, nw, s0, None)
            return _launch.empty_outputs(L, v, phi is not None)
        ys = _launch.new_ys(L, v) if L.cfg.save_y else None  # y before the epilogue, for the backward
        ctx.save_for_backward(q, k, v, theta, cs, gam, scl, qb, kb, psi, zeta, phi, D, z, nw, s0, ys)
        scan = _launch.uses_scan(L)
        t = _pass_tensors(L, flags["norm"], q, k, v, theta, cs, gam, scl, qb, kb, psi, zeta, phi, D, z, nw, s0,
                          chunked=not scan)
        if scan:
            return _launch.scan_forward(L, t, ys)
        sin, sfin = _launch.forward(L, t)
        out = _launch.out_pass(L, t, sin, ys=ys)
        return out, sfin

    @staticmethod
    def backward(ctx, dout, dsfin):
        L = ctx.L
        q, k, v, theta, cs, gam, scl, qb, kb, psi, zeta, phi, D, z, nw, s0, ys = ctx.saved_tensors
        scan_states, scan_dstates = _launch.uses_scan_states(L), _launch.uses_scan_dstates(L)
        # the state chunks' decays are read by the chunked state passes only
        t = _pass_tensors(L, ctx.flags["norm"], q, k, v, theta, cs, gam, scl, qb, kb, psi, zeta, phi, D, z, nw, s0,
                          chunked=not (scan_states and scan_dstates))
        # recompute the incoming states (not kept between passes)
        if scan_states:
            if ys is None and L.cfg.bwd_walk_y:  # the walk forms y again for the output kernel's backward
                ys = _launch.new_ys(L, v)
            sin = _launch.scan_states(L, t, ys)
        else:
            sin = _launch.forward(L, t, _launch.states_dtype(L.cfg, v.dtype))[0]
        g = _launch.backward(L, t, sin, dout.contiguous(), None if dsfin is None else dsfin.contiguous(), ys)
        return (None, None, g["q"], g["k"], g["v"], g["theta"], g["cs"], g["gam"], g["scl"],
                g["qb"].to(qb.dtype), g["kb"].to(kb.dtype), g["psi"].to(psi.dtype),
                None if zeta is None or g["zeta"] is None else g["zeta"].to(zeta.dtype),
                None if phi is None else g["phi"].to(phi.dtype),
                None if D is None else g["D"].to(D.dtype),
                g["z"], None if nw is None else g["nw"].to(nw.dtype),
                None if s0 is None else g["s0"])


class _ChunkCumsum(torch.autograd.Function):
    """c = the inclusive cumsum of the log-decay within each state chunk, (H, TT) fp32 from (H, TT) float64: a
    running sum over all tokens minus its value before the token's chunk. The backward is the same in reverse,
    d adt_t = Σ_{s ≥ t in t's chunk} dc_s = (reverse running sum)_t − (its value at t's chunk end): two gathers,
    where autograd through the forward's gather (repeated indices) ran a sort-based index_put (H200, B8 T4096, one
    MIMO forward+backward: 0.16 + 0.02 ms)."""

    @staticmethod
    def forward(ctx, adt_h, tok_bc_start, tok_bc_end):
        total = torch.nn.functional.pad(torch.cumsum(adt_h, dim=1), (1, 0))            # total[:, t] = Σ_{s<t}
        ctx.save_for_backward(tok_bc_end)
        return (total[:, 1:] - total[:, tok_bc_start]).to(torch.float32).contiguous()

    @staticmethod
    def backward(ctx, dc):
        (tok_bc_end,) = ctx.saved_tensors
        later = torch.nn.functional.pad(torch.cumsum(dc.to(torch.float64).flip(1), dim=1).flip(1), (0, 1))
        return later[:, :-1] - later[:, tok_bc_end], None, None                         # later[:, t] = Σ_{s≥t}


def _rotate_half(x, theta):
    """Half-split rotation of x (…, N) by θ (…, A) (as the reference)."""
    n, a = x.shape[-1], theta.shape[-1]
    half = n // 2
    c, s = torch.cos(theta), torch.sin(theta)
    x0, x1 = x[..., :a], x[..., half:half + a]
    return torch.cat((x0 * c - x1 * s, x[..., a:half], x0 * s + x1 * c, x[..., half + a:]), dim=-1)


@on_device_of
def mimo_triton(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z, input_states,
                chunk_size, cu_seqlens, rms_norm, norm_weight, norm_eps, precision, *, save_y=False, config=None):
    """MIMO Mamba-3 on the Triton kernels. Arguments and returns as :func:`mamba3.mamba3_mimo` (validated).

    ``config`` (tests only) forces a :class:`~.configs.MimoConfig` instead of the dispatcher's choice; ``save_y``
    turns its ``save_y`` on."""
    floats = [x for x in (q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z,
                          norm_weight) if isinstance(x, torch.Tensor)]
    if input_states is not None:
        floats += list(input_states)
    if any(x.dtype == torch.float64 for x in floats):
        # The kernels compute in fp32; float64 is the reference's job.
        from mamba3.reference import mimo_chunked

        return mimo_chunked(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z,
                            input_states, chunk_size=chunk_size or 16, cu_seqlens=cu_seqlens, rms_norm=rms_norm,
                            norm_weight=norm_weight, norm_eps=norm_eps)

    bsz, seqlen, rank, ngroups, dstate = q.shape
    nheads, headdim = v.shape[2], v.shape[3]
    nangles = angles.shape[-1]
    dev = v.device
    if cu_seqlens is not None and cu_seqlens.is_cuda:  # read on the host once (one wait), not by every table
        cu_seqlens = cu_seqlens.cpu()
    f32 = torch.float32
    spec = _device_spec(dev)
    cfg = config or choose_config(spec, MimoProblem(dstate, headdim, rank, v.dtype))
    cfg = cfg.for_dtype(v.dtype).for_chunk(rank, chunk_size)
    if save_y and torch.is_grad_enabled() and any(x.requires_grad for x in floats):  # else no backward to keep y for
        cfg = dataclasses.replace(cfg, save_y=True)
    nseq = bsz if cu_seqlens is None else len(cu_seqlens) - 1
    lengths = None if cu_seqlens is None else cu_seqlens[1:] - cu_seqlens[:-1]
    cfg = for_grid(cfg, programs=-(-headdim // scan_block_p(cfg, headdim, bool(rms_norm))) * nseq * nheads,
                   sm_count=spec.sm_count, rank=rank, dstate=dstate, sixteen_bit=v.dtype != torch.float32,
                   equal_lengths=lengths is None or bool((lengths == lengths[0]).all()))
    ct, cs_tokens = cfg.bm // rank, (cfg.bm // rank) * cfg.state_tiles
    tables = _launch.build_tables(bsz, seqlen, cu_seqlens, ct, cs_tokens, dev)
    tables_bwd = tables if cfg.bm_bwd == cfg.bm else _launch.build_tables(bsz, seqlen, cu_seqlens,
                                                                          cfg.bm_bwd // rank, cs_tokens, dev)
    TT = bsz * seqlen
    H = nheads
    dot_prec, fwd_prec, bwd_prec = _launch.dot_precisions(v.dtype, cfg, precision)
    L = _launch.Launch(cfg=cfg, tables=tables, tables_bwd=tables_bwd, TT=TT, H=H, G=ngroups, R=rank,
                       N2=dstate // 2, A=nangles, P=headdim, BP=block_p(headdim), dot_prec=dot_prec, fwd_prec=fwd_prec,
                       bwd_prec=bwd_prec, eps=float(norm_eps), arch=spec.arch)

    # ---- per-token preparation (PyTorch, differentiable) ----
    theta0 = None if input_states is None else input_states[0].to(f32).contiguous()
    seq_first = tables.seq_start.long()
    angle_chunks = make_chunks(bsz, seqlen, ANGLE_CHUNK, cu_seqlens, dev)
    theta = MimoAngles.apply(angles.contiguous(), dt.to(f32).contiguous(), theta0, angle_chunks, H)
    theta = theta.reshape(TT, H, nangles)

    adt_h = adt.to(torch.float64).transpose(0, 1).reshape(H, TT)
    cs = _ChunkCumsum.apply(adt_h, tables.tok_bc_start, tables.tok_bc_end)            # (H, TT) fp32
    lam = torch.sigmoid(trap.to(f32)).transpose(0, 1).reshape(H, TT)
    dt_h = dt.to(f32).transpose(0, 1).reshape(H, TT)
    gam = (lam * dt_h).contiguous()
    beta = (1.0 - lam) * dt_h
    shifted = torch.cat((beta[:, 1:], beta.new_zeros(H, 1)), dim=1) * (~tables.tok_last).to(f32)
    scl = (gam + shifted).contiguous()

    ones = torch.ones(H, rank, headdim, device=dev, dtype=f32)
    psi = ones if mimo_v is None else mimo_v.to(f32).contiguous()
    if z is not None and mimo_z is None:
        mimo_z = ones
    s0 = None
    if input_states is not None:
        _, ssm_in, k_in, v_in = input_states
        v_in_rank = v_in.to(f32)[:, None] * psi.transpose(0, 1)                          # (NS, R, H, P)
        c0 = beta[:, seq_first].transpose(0, 1)                                          # (NS, H)
        s0 = ssm_in.to(f32) + c0[..., None, None] * torch.einsum("srhp,srhn->shpn", v_in_rank, k_in.to(f32))
        s0 = s0.contiguous()

    qf = q.reshape(TT, rank, ngroups, dstate).contiguous()
    kf = k.reshape(TT, rank, ngroups, dstate).contiguous()
    vf = v.reshape(TT, H, headdim).contiguous()
    zf = None if z is None else z.reshape(TT, H, headdim).contiguous()
    flags = dict(norm=bool(rms_norm))
    out, sfin = _MimoCore.apply(
        L, flags, qf, kf, vf, theta, cs, gam, scl, q_bias.to(f32).contiguous(), k_bias.to(f32).contiguous(), psi,
        mimo_z.to(f32).contiguous() if (mimo_z is not None and z is not None) else None,
        None if mimo_out is None else mimo_out.to(f32).contiguous(),
        None if D is None else D.to(f32).contiguous(), zf,
        None if norm_weight is None or not rms_norm else norm_weight.to(f32).reshape(H, headdim).contiguous(),
        s0)
    out = out.reshape(bsz, seqlen, H, headdim) if mimo_out is not None else out.reshape(bsz, seqlen, rank, H,
                                                                                       headdim)

    # ---- final states (PyTorch, differentiable) ----
    last = tables.seq_end.long() - 1
    theta_last = theta[last]                                                             # (NS, H, A)
    hg = H // ngroups
    k_last = kf[last].to(f32)[:, :, torch.arange(H, device=dev) // hg]                   # (NS, R, H, N)
    k_last = _rotate_half(k_last + k_bias.to(f32).transpose(0, 1), theta_last[:, None])
    v_last = vf[last]
    return out, (theta_last, sfin, k_last, v_last)
