"""Host launchers of the MIMO kernels: chunk tables, forward and backward passes, and the AOT launch list."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from ..common.state_passing import state_passing
from .bwd import mimo_bwd_dqk_kernel, mimo_bwd_dv_kernel, mimo_state_bwd_kernel, mimo_state_scan_bwd_kernel
from .configs import MimoConfig, block_p, scan_block_p
from .fwd import mimo_chunk_state_kernel, mimo_out_kernel, mimo_scan_out_kernel

# Elements of the (P·N) state per program of the state-passing kernels, which walk a sequence's state chunks in
# order: small slabs put NS·H·(P·N/256) programs in flight, which is what hides each step's latency when there are
# few sequences (as SISO's state pass; with 1024, B=1 T=32768 spent 7.9 of its 16.8 ms forward there on the H200).
STATE_BLK = 256


@dataclass(frozen=True)
class Tables:
    """Chunk tables over the flattened token axis (all int32 on the device, built on the host once per shape).

    State chunks (``bc_*``) never cross a sequence boundary; token tiles (``sc_*``) tile each state chunk."""

    ns: int
    nbc: int
    nsc: int
    seq_bc: torch.Tensor    # (NS+1,) first state chunk of each sequence
    seq_table: torch.Tensor  # (NS, 2) [first state chunk, number of state chunks] (``common.state_passing``)
    max_bc: int             # most state chunks of any sequence
    seq_start: torch.Tensor  # (NS,)
    seq_end: torch.Tensor    # (NS,)
    bc_start: torch.Tensor
    bc_end: torch.Tensor
    sc_start: torch.Tensor
    sc_end: torch.Tensor
    sc_bc: torch.Tensor
    sc_seq: torch.Tensor
    tok_bc_start: torch.Tensor  # (TT,) int64: first token of the token's state chunk
    tok_bc_end: torch.Tensor    # (TT,) int64: the token after its state chunk's last
    tok_seq: torch.Tensor       # (TT,) int64: sequence of the token
    tok_last: torch.Tensor      # (TT,) bool: last token of its sequence


@functools.lru_cache(maxsize=64)
def _tables_cached(bounds: tuple, ct: int, cs: int, device: str) -> Tables:
    seq_bc, bc_start, bc_end, sc_start, sc_end, sc_bc, sc_seq = [0], [], [], [], [], [], []
    for s in range(len(bounds) - 1):
        a, b = bounds[s], bounds[s + 1]
        for c0 in range(a, b, cs):
            ce = min(c0 + cs, b)
            bc_id = len(bc_start)
            bc_start.append(c0)
            bc_end.append(ce)
            for t0 in range(c0, ce, ct):
                sc_start.append(t0)
                sc_end.append(min(t0 + ct, ce))
                sc_bc.append(bc_id)
                sc_seq.append(s)
        seq_bc.append(len(bc_start))
    i32 = functools.partial(torch.tensor, dtype=torch.int32)
    lens = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    bc_len = [e - s for s, e in zip(bc_start, bc_end)]
    tok_bc_start = torch.repeat_interleave(torch.tensor(bc_start, dtype=torch.int64), torch.tensor(bc_len))
    tok_bc_end = torch.repeat_interleave(torch.tensor(bc_end, dtype=torch.int64), torch.tensor(bc_len))
    tok_seq = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    tok_last = torch.zeros(bounds[-1], dtype=torch.bool)
    tok_last[torch.tensor(bounds[1:]) - 1] = True
    dev = torch.device(device)

    def put(x):  # without blocking: a blocking host-to-device copy waits for the device's queue to drain
        return x.to(dev, non_blocking=True)

    nbc_seq = [b - a for a, b in zip(seq_bc[:-1], seq_bc[1:])]
    return Tables(ns=len(bounds) - 1, nbc=len(bc_start), nsc=len(sc_start),
                  seq_bc=put(i32(seq_bc)), seq_table=put(i32([[a, n] for a, n in zip(seq_bc[:-1], nbc_seq)])),
                  max_bc=max(nbc_seq), seq_start=put(i32(bounds[:-1])), seq_end=put(i32(bounds[1:])),
                  bc_start=put(i32(bc_start)), bc_end=put(i32(bc_end)), sc_start=put(i32(sc_start)),
                  sc_end=put(i32(sc_end)), sc_bc=put(i32(sc_bc)), sc_seq=put(i32(sc_seq)),
                  tok_bc_start=put(tok_bc_start), tok_bc_end=put(tok_bc_end), tok_seq=put(tok_seq),
                  tok_last=put(tok_last))


def build_tables(bsz: int, seqlen: int, cu_seqlens, ct: int, cs: int, device) -> Tables:
    if cu_seqlens is None:
        bounds = tuple(i * seqlen for i in range(bsz + 1))
    else:
        bounds = tuple(int(x) for x in cu_seqlens.tolist())
    return _tables_cached(bounds, ct, cs, str(torch.device(device)))


@dataclass
class Launch:
    """Everything shape-like the kernels need, derived once per call."""

    cfg: MimoConfig
    tables: Tables
    tables_bwd: Tables
    TT: int
    H: int
    G: int
    R: int
    N2: int
    A: int
    P: int
    BP: int
    dot_prec: str  # dots with fp32 operands (states, and every dot of the backward): "tf32x3" or "tf32"
    fwd_prec: str  # token-by-token dots of the forward (chunk states, scores, values): "bf16"/"fp16" for 16-bit inputs
    bwd_prec: str  # the dq, dk and dv kernels' dots: "bf16"/"fp16" for 16-bit inputs with cfg.bwd_dots16, else dot_prec
    # (the dq and dk kernels: dot_prec where cfg.bwd16_dqk is off, see dqk_precision)
    eps: float
    arch: int  # the device's compute capability (launch options: ``MimoConfig.output_options``, ``state_options``)

    @property
    def HG(self):
        return self.H // self.G


def dot_precisions(dtype, cfg: MimoConfig, precision: str = "ieee") -> tuple[str, str, str]:
    """(dot_prec, fwd_prec, bwd_prec) of :class:`Launch` for inputs of ``dtype``. fp32 inputs: tf32x3 (three tf32
    MMAs, fp32-accurate) unless the caller opts into ``precision="tf32"``. bf16/fp16 inputs: tf32 on fp32 operands,
    except the forward's token-by-token dots (chunk states, scores, values) where ``cfg.fwd_dots16``: their
    operands are rounded to the input's 16-bit type (fp32 accumulation). The states' product always stays tf32:
    a bf16 state moved the output's error at T = 1 with input states from 2.2e-3 to 3.5e-3 (interpreter, against
    the 3e-3 bar). For fp16 inputs the decay-weighted scores γ·q̃·k̃ are then rounded to fp16 too (as in SISO's
    16-bit path), so |γ·q̃·k̃| must stay below 65504 (normalised q/k, as the layer feeds them, are far below it).
    ``cfg.bwd_dots16`` rounds the operands of the dq, dk and dv kernels' dots likewise (see
    :class:`~.configs.MimoConfig`)."""
    dot_prec = "tf32x3" if (dtype == torch.float32 and precision == "ieee") else "tf32"
    dt16 = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    fwd_prec = dt16 if dt16 is not None and cfg.fwd_dots16 else dot_prec
    return dot_prec, fwd_prec, (dt16 if dt16 is not None and cfg.bwd_dots16 else dot_prec)


def dqk_precision(cfg: MimoConfig, dot_prec: str, bwd_prec: str) -> str:
    """The dq and dk kernels' dot precision: the backward's (``bwd_prec``) unless ``cfg.bwd16_dqk`` is off."""
    return bwd_prec if cfg.bwd16_dqk else dot_prec


def dpw_dtype(cfg: MimoConfig, dqk_prec: str, dtype: torch.dtype) -> torch.dtype:
    """The stored weighted dP blocks' dtype (``MimoConfig.bwd_store_dpw``) for inputs of ``dtype``: the dq / dk
    kernels' 16-bit dot operand dtype where their dots take 16-bit operands (they round it so before the dot anyway:
    the same products at half the memory and traffic); bf16 for 16-bit inputs with ``cfg.dpw16`` (fp32's range);
    fp32 otherwise."""
    if dqk_prec in ("bf16", "fp16"):  # the input's own 16-bit type (dot_precisions)
        return dtype
    return torch.bfloat16 if cfg.dpw16 and dtype != torch.float32 else torch.float32


def chunk_states(L: Launch, mode: int, x, y, bias, rot, cs, scl, psi):
    """Per state chunk: ΔS (mode 0, x = v, y = k) or Σ e^{c} dy q̃ᵀ (mode 1, x = dy, y = q)."""
    cfg, T = L.cfg, L.tables
    out = torch.empty(T.nbc, L.H, L.P, 2 * L.N2, device=x.device, dtype=torch.float32)
    bps = min(cfg.bp_state, L.BP)
    grid = (triton.cdiv(L.P, bps) * triton.cdiv(L.N2, cfg.bk), T.nbc, L.H)
    if mode == 0:
        sx_t, sx_r = L.H * L.P, 0
    else:
        sx_t, sx_r = L.R * L.H * L.P, L.H * L.P
    mimo_chunk_state_kernel[grid](
        x, sx_t, sx_r, psi, y, L.R * L.G * 2 * L.N2, L.G * 2 * L.N2, bias, rot, L.H * 2 * L.A, cs, scl, out,
        T.bc_start, T.bc_end, L.TT, L.H, L.HG, L.G, L.N2, L.A, L.P,
        R=L.R, BM=cfg.bm, BP=bps, BK=cfg.bk, MODE=mode, DOT_PREC=L.fwd_prec if mode == 0 else L.dot_prec,
        **cfg.state_options(L.arch, y.dtype == torch.float32))
    return out


def chunk_decays(L: Launch, cs):
    """(state chunks, H) fp32: each state chunk's total log-decay, the in-chunk cumsum at its last token."""
    return cs[:, L.tables.bc_end.long() - 1].t().contiguous()


def state_pass_fwd(L: Launch, buf, s0, decay, out=None):
    """Each state chunk's ΔS becomes the state entering it, in place or into ``out`` (rounded to its dtype; buf then
    keeps the ΔS) (``common.state_passing``, which SISO's chunks use too; ``decay`` from :func:`chunk_decays`).
    Returns the final states."""
    T = L.tables
    sfin = _final_states(L, buf.device)
    state_passing(buf, decay, T.seq_table, T.max_bc, init=s0, final=sfin, block=STATE_BLK, out=out)
    return sfin


def state_pass_bwd(L: Launch, buf, sin, dsfin, decay, out=None):
    """Each state chunk's dL becomes dS_end, in place or into ``out`` (rounded to its dtype). Returns the input
    state's gradient and, per state chunk, the gradient of its total log-decay through the incoming state
    (``mimo_state_bwd_kernel``)."""
    T = L.tables
    PN = L.P * 2 * L.N2
    nblk = triton.cdiv(PN, STATE_BLK)
    ds0 = torch.empty(T.ns, L.H, L.P, 2 * L.N2, device=buf.device, dtype=torch.float32)
    dcend = torch.empty(nblk, L.H, T.nbc, device=buf.device, dtype=torch.float32)
    mimo_state_bwd_kernel[(nblk, T.ns, L.H)](
        buf, buf if out is None else out, sin, dsfin if dsfin is not None else sin, ds0, dcend, decay, T.seq_bc, L.H,
        PN, T.nbc, HAS_DSFIN=dsfin is not None, BLK=STATE_BLK, num_warps=4, num_stages=1)
    return ds0, dcend.sum(0)


def or_stand_in(stand_in: torch.Tensor) -> Callable:
    """A function that passes a tensor argument through and replaces an absent one (None) by ``stand_in``: a
    pointer of the right device that the kernel, told by its flags that the argument is absent, never reads."""
    return lambda x: stand_in if x is None else x


def _out_shape(L: Launch, has_out: bool):
    """(TT, H, P) with the rank contraction (φ), else the per-rank output (TT, R, H, P)."""
    return (L.TT, L.H, L.P) if has_out else (L.TT, L.R, L.H, L.P)


def _final_states(L: Launch, device):
    return torch.empty(L.tables.ns, L.H, L.P, 2 * L.N2, device=device, dtype=torch.float32)


def empty_outputs(L: Launch, v, has_out: bool):
    """Uninitialised (out, final ssm state) as :func:`out_pass` and :func:`forward` return them for values v (the
    gradients-only replay, ``common.replay``)."""
    return torch.empty(_out_shape(L, has_out), device=v.device, dtype=v.dtype), _final_states(L, v.device)


def out_pass(L: Launch, t, sin, bwd=False, dout=None, ys=None):
    """Forward outputs (bwd=False) or the epilogue backward (bwd=True, returns dy, dz, dφ, dζ, dw partials).
    ys: the pre-epilogue y (TT, R, H, P) in ``ys_dtype`` that the forward stores (bwd=False) or the backward reads
    instead of computing it again (bwd=True; ``MimoConfig.save_y``), or None."""
    cfg, T = L.cfg, L.tables
    q, k, v, rot, cs, gam, scl = t["q"], t["k"], t["v"], t["rot"], t["cs"], t["gam"], t["scl"]
    has_out = t["phi"] is not None
    dev = v.device
    f32 = torch.float32
    out = dy = dz = dphip = dzetap = dnwp = None
    if not bwd:
        out = torch.empty(_out_shape(L, has_out), device=dev, dtype=v.dtype)
    else:
        dy = torch.empty(L.TT, L.R, L.H, L.P, device=dev, dtype=f32)
        if t["z"] is not None:
            dz = torch.empty_like(t["z"])
            dzetap = torch.empty(T.nsc, L.H, L.R, L.P, device=dev, dtype=f32)
        if has_out:
            dphip = torch.empty(T.nsc, L.H, L.R, L.P, device=dev, dtype=f32)
        if t["nw"] is not None:
            dnwp = torch.empty(T.nsc, L.H, L.P, device=dev, dtype=f32)
    d = or_stand_in(cs)
    y_io = 0 if ys is None else 1 + bwd
    mimo_out_kernel[(T.nsc, L.H)](
        q, k, v, rot, cs, gam, scl, t["qb"], t["kb"], t["psi"], d(t["zeta"]), d(t["phi"]), d(t["D"]),
        d(t["z"]), d(t["nw"]), sin, d(out), d(dout), d(dy), d(dz), d(dphip), d(dzetap), d(dnwp), d(ys),
        T.sc_start, T.sc_end, T.sc_bc, T.bc_start, L.TT, L.H, L.HG, L.G, L.N2, L.A, L.P, L.eps,
        R=L.R, BM=cfg.bm, BK=cfg.bk, BP=L.BP, HAS_D=t["D"] is not None, HAS_Z=t["z"] is not None,
        HAS_OUT=has_out, NORM=t["norm"], HAS_NW=t["nw"] is not None, BWD=bwd, ONE_K=L.N2 <= cfg.bk,
        DOT_PREC=L.dot_prec, TOK_PREC=L.dot_prec if bwd else L.fwd_prec, Y_IO=y_io,
        **cfg.output_options(L.arch, L.BP, v.dtype == torch.float32, y_io, L.N2, bwd))
    if not bwd:
        return out
    return dy, dz, dphip, dzetap, dnwp


def uses_scan(L: Launch) -> bool:
    """Whether the forward runs as :func:`scan_forward` (``MimoConfig.scan_fwd``, whose N/2 ≤ bk condition this
    checks; state_tiles = 1 is the configuration's own check)."""
    return L.cfg.scan_fwd and L.N2 <= L.cfg.bk


def ys_dtype(cfg: MimoConfig, dtype: torch.dtype) -> torch.dtype:
    """The pre-epilogue y's dtype where it is stored (``MimoConfig.save_y``, ``bwd_walk_y``): bf16 for bf16 inputs
    with ``save_y16``, else fp32."""
    return torch.bfloat16 if cfg.save_y16 and dtype == torch.bfloat16 else torch.float32


def new_ys(L: Launch, v):
    """An uninitialised buffer for the pre-epilogue y (TT, R, H, P) (``MimoConfig.save_y``), in :func:`ys_dtype`."""
    return torch.empty(L.TT, L.R, L.H, L.P, device=v.device, dtype=ys_dtype(L.cfg, v.dtype))


def scan_forward(L: Launch, t, ys=None):
    """(out, final ssm state) of the forward by ``mimo_scan_out_kernel``: one program per (P block, sequence,
    head), all of P with the fused RMSNorm; it stores y before the epilogue at ys where given."""
    cfg, T = L.cfg, L.tables
    has_out = t["phi"] is not None
    v = t["v"]
    out = torch.empty(_out_shape(L, has_out), device=v.device, dtype=v.dtype)
    sfin = _final_states(L, v.device)
    bp = scan_block_p(cfg, L.P, t["norm"])
    d = or_stand_in(t["cs"])
    mimo_scan_out_kernel[(triton.cdiv(L.P, bp), T.ns, L.H)](
        t["q"], t["k"], v, t["rot"], t["cs"], t["gam"], t["scl"], t["qb"], t["kb"], t["psi"], d(t["zeta"]),
        d(t["phi"]), d(t["D"]), d(t["z"]), d(t["nw"]), d(t["s0"]), out, sfin, sfin, d(ys),
        T.seq_table, T.bc_start, T.bc_end, T.max_bc, L.TT, L.H, L.HG, L.G, L.N2, L.A, L.P, L.eps,
        R=L.R, BM=cfg.bm, BK=cfg.bk, BP=bp, HAS_D=t["D"] is not None, HAS_Z=t["z"] is not None, HAS_OUT=has_out,
        NORM=t["norm"], HAS_NW=t["nw"] is not None, HAS_S0=t["s0"] is not None, DOT_PREC=L.dot_prec,
        TOK_PREC=L.fwd_prec, GATHER=cfg.scan_gather, SAVE_Y=ys is not None, num_warps=cfg.scan_warps,
        num_stages=cfg.stages)
    return out, sfin


def states_dtype(cfg: MimoConfig, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the state copies the backward's chunk kernels read (S entering each state chunk, dS at its end)
    for inputs of ``dtype``: bf16 with ``MimoConfig.bwd_states16`` and 16-bit inputs, else fp32."""
    return torch.bfloat16 if cfg.bwd_states16 and dtype != torch.float32 else torch.float32


def uses_scan_states(L: Launch) -> bool:
    """Whether the backward recomputes the states entering the state chunks with :func:`scan_states`
    (``MimoConfig.scan_states``, with the scan forward only)."""
    return L.cfg.scan_states and uses_scan(L)


def scan_states(L: Launch, t, ys=None):
    """The state entering each state chunk, (state chunks, H, P, N) in :func:`states_dtype`, by the states-only walk
    of ``mimo_scan_out_kernel`` (STATES): what :func:`forward` returns first, without the local chunk states in
    DRAM. Where ``ys`` is given (``MimoConfig.bwd_walk_y``), the walk also stores the pre-epilogue y there, as the
    forward formed it."""
    cfg, T = L.cfg, L.tables
    sin = torch.empty(T.nbc, L.H, L.P, 2 * L.N2, device=t["v"].device, dtype=states_dtype(cfg, t["v"].dtype))
    bp = scan_block_p(cfg, L.P, norm=False)
    cs = t["cs"]  # stands in for the pointers the states-only walk does not read
    d = or_stand_in(cs)
    has_d = ys is not None and t["D"] is not None  # D·ṽ is part of y
    mimo_scan_out_kernel[(triton.cdiv(L.P, bp), T.ns, L.H)](
        t["q"], t["k"], t["v"], t["rot"], cs, t["gam"], t["scl"], t["qb"], t["kb"], t["psi"], cs, cs,
        d(t["D"]), cs, cs, d(t["s0"]), cs, cs, sin, d(ys),
        T.seq_table, T.bc_start, T.bc_end, T.max_bc, L.TT, L.H, L.HG, L.G, L.N2, L.A, L.P, L.eps,
        R=L.R, BM=cfg.bm, BK=cfg.bk, BP=bp, HAS_D=has_d, HAS_Z=False, HAS_OUT=False, NORM=False, HAS_NW=False,
        HAS_S0=t["s0"] is not None, DOT_PREC=L.dot_prec, TOK_PREC=L.fwd_prec, STATES=True, GATHER=cfg.scan_gather,
        SAVE_Y=ys is not None, num_warps=cfg.scan_warps, num_stages=cfg.stages)
    return sin


def forward(L: Launch, t, copy_dtype=torch.float32):
    """Returns (sin: the state entering each state chunk, in ``copy_dtype``, final ssm state)."""
    buf = chunk_states(L, 0, t["v"], t["k"], t["kb"], t["rot"], t["cs"], t["scl"], t["psi"])
    sin = buf if copy_dtype == torch.float32 else torch.empty_like(buf, dtype=copy_dtype)
    sfin = state_pass_fwd(L, buf, t["s0"], t["decay"], out=sin)
    return sin, sfin


def uses_scan_dstates(L: Launch) -> bool:
    """Whether the backward's reverse state pass is :func:`state_scan_bwd` (``MimoConfig.scan_dstates``, with the
    scan forward only)."""
    return L.cfg.scan_dstates and uses_scan(L)


def state_scan_bwd(L: Launch, t, dy, sin, dsfin):
    """(dS_end per state chunk, the input state's gradient, per state chunk the gradient of its total log-decay
    through the incoming state) by ``mimo_state_scan_bwd_kernel``: what :func:`chunk_states` (mode 1) and
    :func:`state_pass_bwd` give (dS_end in :func:`states_dtype`)."""
    cfg, T = L.cfg, L.tables
    dev = dy.device
    bps = min(cfg.bp_state, L.BP)
    nblk = triton.cdiv(L.P, bps) * triton.cdiv(L.N2, cfg.dstates_block)
    dsend = torch.empty(T.nbc, L.H, L.P, 2 * L.N2, device=dev, dtype=states_dtype(cfg, t["v"].dtype))
    ds0 = torch.empty(T.ns, L.H, L.P, 2 * L.N2, device=dev, dtype=torch.float32)
    dcend = torch.empty(nblk, L.H, T.nbc, device=dev, dtype=torch.float32)
    mimo_state_scan_bwd_kernel[(nblk, T.ns, L.H)](
        dy, t["q"], t["qb"], t["rot"], t["cs"], sin, dsfin if dsfin is not None else sin, dsend, ds0, dcend,
        T.seq_table, T.bc_start, T.bc_end, T.max_bc, T.nbc, L.TT, L.H, L.HG, L.G, L.N2, L.A, L.P,
        R=L.R, BM=cfg.bm, BP=bps, BK=cfg.dstates_block, HAS_DSFIN=dsfin is not None, DOT_PREC=L.dot_prec,
        **cfg.dstates_options(L.arch, t["v"].dtype == torch.float32))
    return dsend, ds0, dcend.sum(0)


def backward(L: Launch, t, sin, dout, dsfin, ys=None):
    """All kernel-side gradients (ys: the forward's pre-epilogue y, or None to compute it again). Returns a
    dict."""
    cfg, T = L.cfg, L.tables
    v = t["v"]
    dev = v.device
    f32 = torch.float32
    dy, dz, dphip, dzetap, dnwp = out_pass(L, t, sin, bwd=True, dout=dout, ys=ys)
    if uses_scan_dstates(L):
        dsend, ds0, dcend = state_scan_bwd(L, t, dy, sin, dsfin)
    else:
        dloc = chunk_states(L, 1, dy, t["q"], t["qb"], t["rot"], t["cs"], t["scl"], t["psi"])
        copy_dtype = states_dtype(cfg, v.dtype)  # local dS → dS_end, in place unless the copy is 16-bit
        dsend = dloc if copy_dtype == torch.float32 else torch.empty_like(dloc, dtype=copy_dtype)
        ds0, dcend = state_pass_bwd(L, dloc, sin, dsfin, t["decay"], out=dsend)
        del dloc
    bk_dqk, warps_dqk = cfg.dqk_tiles(L.arch, v.dtype == torch.float32)
    nkb = triton.cdiv(L.N2, bk_dqk)
    TB = L.tables_bwd
    dq = torch.empty_like(t["q"])
    dk = torch.empty_like(t["k"])
    dth = torch.empty(L.TT, L.H, max(L.A, 1), device=dev, dtype=f32)
    # The log-decay gradient's per-token parts, summed at the end (every entry has one writer; unwritten ones are 0):
    # dcp, the inter-chunk term's per N block (dq launch); dcv, the dv kernel's: in-chunk pairs (one row-sum slot per
    # key tile at or before the query's tile in its chunk), the key tokens' part, the chunks' total decays (per tile
    # of the chunk, at its last token). Two allocations, not slices of one: a slice's base pointer would lose its
    # 16-byte alignment for some TT, and a new T would recompile the dv kernel (tests/gpu: H200).
    nsl = triton.cdiv((cfg.bm // L.R) * cfg.state_tiles, cfg.bm_bwd // L.R)  # tiles per state chunk (backward)
    dcp = torch.empty(nkb, L.H, L.TT, device=dev, dtype=f32)
    dcv = torch.zeros(2 * nsl + 1, L.H, L.TT, device=dev, dtype=f32)
    dqbp = torch.empty(TB.nsc, L.H, L.R, 2 * L.N2, device=dev, dtype=f32)
    dkbp = torch.empty_like(dqbp)
    q, k, rot, cs, gam, scl = t["q"], t["k"], t["rot"], t["cs"], t["gam"], t["scl"]
    dv = torch.empty_like(v)
    dpsip = torch.empty(TB.nsc, L.H, L.R, L.P, device=dev, dtype=f32)
    ddp = torch.empty(TB.nsc, L.H, device=dev, dtype=f32)
    dscl = torch.empty(L.H, L.TT, device=dev, dtype=f32)
    dgam = torch.empty(L.H, L.TT, device=dev, dtype=f32)
    # the weighted dP blocks, per (key tile, head, query tile of the chunk from the key's on), for the dq / dk
    # kernels (MimoConfig.bwd_store_dpw): written by the dv kernel, which therefore runs first
    dqk_prec = dqk_precision(cfg, L.dot_prec, L.bwd_prec)
    dpw = (torch.empty(TB.nsc, L.H, nsl, cfg.bm_bwd, cfg.bm_bwd, device=dev, dtype=dpw_dtype(cfg, dqk_prec, v.dtype))
           if cfg.bwd_store_dpw else cs)
    mimo_bwd_dv_kernel[(TB.nsc, L.H)](
        q, k, v, rot, cs, gam, scl, t["qb"], t["kb"], t["psi"], t["D"] if t["D"] is not None else cs, dy, dsend,
        dv, dpsip, ddp, dscl, dgam, dcv, dpw,
        TB.sc_start, TB.sc_end, TB.sc_bc, TB.bc_start, TB.bc_end, L.TT, L.H, L.HG, L.G, L.N2, L.A, L.P, nsl,
        R=L.R, BM=cfg.bm_bwd, BK=cfg.dv_block, BP=L.BP, HAS_D=t["D"] is not None, ONE_K=L.N2 <= cfg.dv_block,
        DOT_PREC=L.bwd_prec, STORE_DPW=cfg.bwd_store_dpw, num_warps=cfg.warps_bwd, num_stages=cfg.stages)
    for is_k, dx, dxbp in ((False, dq, dqbp), (True, dk, dkbp)):
        mimo_bwd_dqk_kernel[(nkb, TB.nsc, L.G)](
            q, k, v, rot, cs, gam, scl, t["qb"], t["kb"], t["psi"], dy, sin, dsend, dpw, dx, dth, dcp, dxbp,
            TB.sc_start, TB.sc_end, TB.sc_bc, TB.bc_start, TB.bc_end, L.TT, L.H, L.HG, L.G, L.N2, L.A, L.P, nsl,
            R=L.R, BM=cfg.bm_bwd, BK=bk_dqk, BP=L.BP, IS_K=is_k,
            DOT_PREC=dqk_prec, LOAD_DPW=cfg.bwd_store_dpw,
            num_warps=warps_dqk, num_stages=cfg.stages)
    dcs = dcp.sum(0) + dcv.sum(0)
    dcs.index_add_(1, (T.bc_end - 1).long(), dcend)
    return dict(q=dq, k=dk, v=dv, theta=dth[..., :L.A], cs=dcs, gam=dgam, scl=dscl, qb=dqbp.sum(0), kb=dkbp.sum(0),
                psi=dpsip.sum(0), D=ddp.sum(0) if t["D"] is not None else None,
                z=dz, zeta=dzetap.sum(0) if dzetap is not None else None,
                phi=dphip.sum(0) if dphip is not None else None,
                nw=dnwp.sum(0) if dnwp is not None else None, s0=ds0)


def aot_kernel_launches(cfg: MimoConfig, headdim: int, dtype, arch: int, dstate: int = 128,
                        kernels: tuple[str, ...] | None = None):
    """Representative launches of the MIMO kernels for one configuration (AOT lane); ``kernels`` filters by
    name prefix. Integer arguments are the bench shape's (multiples of 16, as real calls pass them)."""
    from mamba3.testing.aot import KernelLaunch

    cfg = cfg.for_dtype(dtype)
    H, G, R, N, P, A = 32, 1, 4, dstate, headdim, dstate // 4
    N2, TT, NBC = N // 2, 4096, 64
    BP = block_p(P)
    prec, fwd_prec, bwd_prec = dot_precisions(dtype, cfg)
    e = lambda *shape, dt=torch.float32: torch.empty(*shape, dtype=dt)  # noqa: E731
    i32 = lambda n: torch.empty(n, dtype=torch.int32)  # noqa: E731
    q = e(16, dt=dtype)
    v = e(16, dt=dtype)
    f = e(16)
    ys = e(16, dt=ys_dtype(cfg, dtype))
    sin = dsend = e(16, dt=states_dtype(cfg, dtype))  # the backward's state copies
    tag = f"{cfg.name}-N{N}-P{P}-{str(dtype).split('.')[-1]}"
    bps = min(cfg.bp_state, BP)
    out = []
    for mode in (0, 1):
        x = v if mode == 0 else f
        out.append(KernelLaunch(
            f"mimo_chunk_state_kernel[mode{mode}]-{tag}", mimo_chunk_state_kernel,
            (x, H * P if mode == 0 else R * H * P, 0 if mode == 0 else H * P, f, q, R * G * N, G * N, f, f, H * 2 * A,
             f, f, f, i32(16), i32(16), TT, H, H // G, G, N2, A, P),
            dict(R=R, BM=cfg.bm, BP=bps, BK=cfg.bk, MODE=mode, DOT_PREC=fwd_prec if mode == 0 else prec,
                 **cfg.state_options(arch, dtype == torch.float32))))
    out.append(KernelLaunch(f"mimo_state_bwd_kernel-{tag}", mimo_state_bwd_kernel,
                            (f, dsend, sin, f, f, f, f, i32(16), H, P * N, NBC),
                            dict(HAS_DSFIN=True, BLK=STATE_BLK, num_warps=4, num_stages=1)))
    for bwd in (False, True):
        y_io = 1 + bwd if cfg.save_y else 0
        out.append(KernelLaunch(
            f"mimo_out_kernel[{'bwd' if bwd else 'fwd'}]-{tag}", mimo_out_kernel,
            (q, q, v, f, f, f, f, f, f, f, f, f, f, v, f, sin if bwd else f, v, v, f, v, f, f, f, ys,
             i32(16), i32(16), i32(16), i32(16), TT, H, H // G, G, N2, A, P, 1e-5),
            dict(R=R, BM=cfg.bm, BK=cfg.bk, BP=BP, HAS_D=True, HAS_Z=True, HAS_OUT=True, NORM=True, HAS_NW=True,
                 BWD=bwd, ONE_K=N2 <= cfg.bk, DOT_PREC=prec, TOK_PREC=prec if bwd else fwd_prec,
                 Y_IO=y_io, **cfg.output_options(arch, BP, dtype == torch.float32, y_io, N2, bwd))))
    if cfg.scan_fwd:  # with the fused RMSNorm where the block holds all of P
        bps = scan_block_p(cfg, P, norm=False)
        for states in (False, True) if cfg.scan_states else (False,):
            out.append(KernelLaunch(
                f"mimo_scan_out_kernel[bp{bps}-w{cfg.scan_warps}{'-states' if states else ''}]-{tag}",
                mimo_scan_out_kernel,
                (q, q, v, f, f, f, f, f, f, f, f, f, f, v, f, f, v, f, sin if states else f, ys, i32(16), i32(16),
                 i32(16), 64, TT, H, H // G, G, N2, A, P, 1e-5),
                dict(R=R, BM=cfg.bm, BK=cfg.bk, BP=bps, HAS_D=not states or cfg.bwd_walk_y, HAS_Z=not states,
                     HAS_OUT=not states, NORM=bps >= BP and not states, HAS_NW=bps >= BP and not states, HAS_S0=True,
                     DOT_PREC=prec, TOK_PREC=fwd_prec, STATES=states, GATHER=cfg.scan_gather,
                     SAVE_Y=cfg.bwd_walk_y if states else cfg.save_y, num_warps=cfg.scan_warps,
                     num_stages=cfg.stages)))
    if cfg.scan_dstates:
        bps = min(cfg.bp_state, BP)
        out.append(KernelLaunch(
            f"mimo_state_scan_bwd_kernel-{tag}", mimo_state_scan_bwd_kernel,
            (f, q, f, f, f, sin, f, dsend, f, f, i32(16), i32(16), i32(16), 64, NBC, TT, H, H // G, G, N2, A, P),
            dict(R=R, BM=cfg.bm, BP=bps, BK=cfg.dstates_block, HAS_DSFIN=True, DOT_PREC=prec,
                 **cfg.dstates_options(arch, dtype == torch.float32))))
    dqk_prec = dqk_precision(cfg, prec, bwd_prec)
    dpw = e(16, dt=dpw_dtype(cfg, dqk_prec, dtype)) if cfg.bwd_store_dpw else f
    bk_dqk, warps_dqk = cfg.dqk_tiles(arch, dtype == torch.float32)
    for is_k in (False, True):
        out.append(KernelLaunch(
            f"mimo_bwd_dqk_kernel[{'dk' if is_k else 'dq'}]-{tag}", mimo_bwd_dqk_kernel,
            (q, q, v, f, f, f, f, f, f, f, f, sin, dsend, dpw, q, f, f, f,
             i32(16), i32(16), i32(16), i32(16), i32(16), TT, H, H // G, G, N2, A, P, 1),
            dict(R=R, BM=cfg.bm_bwd, BK=bk_dqk, BP=BP, IS_K=is_k, DOT_PREC=dqk_prec,
                 LOAD_DPW=cfg.bwd_store_dpw, num_warps=warps_dqk, num_stages=cfg.stages)))
    out.append(KernelLaunch(
        f"mimo_bwd_dv_kernel-{tag}", mimo_bwd_dv_kernel,
        (q, q, v, f, f, f, f, f, f, f, f, f, dsend, v, f, f, f, f, f, dpw,
         i32(16), i32(16), i32(16), i32(16), i32(16), TT, H, H // G, G, N2, A, P, 2),
        dict(R=R, BM=cfg.bm_bwd, BK=cfg.dv_block, BP=BP, HAS_D=True, ONE_K=N2 <= cfg.dv_block, DOT_PREC=bwd_prec,
             STORE_DPW=cfg.bwd_store_dpw, num_warps=cfg.warps_bwd, num_stages=cfg.stages)))
    from .angles import aot_angle_launches

    out += aot_angle_launches(H, A)
    if kernels is not None:
        out = [x for x in out if x.name.startswith(kernels)]
    return out
