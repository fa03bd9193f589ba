"""``siso_triton``: the autograd Function over the SISO Triton kernels (entry point called by ``mamba3_siso``).

Forward: chunk sums → float64 angle offsets → sin/cos of every angle (fp32 planes) → chunk states → state passing
→ outputs (see ``fwd.py``).
Backward: recomputes the chunk states (nothing of size P×N per chunk is kept between forward and backward),
computes the local dS per chunk, passes dS backwards across chunks, then the two per-chunk gradient kernels
(``bwd.py``) and the angle backward (``common/cumsum.py``). A few O(B·H·T) elementwise steps (ddt, dtrap from
dγ and dscale) and O(NS·H·P·N) input-state steps run as plain torch ops.

Precision: angles, cumsums, decays and states are fp32 for every input dtype; the output has v's dtype;
final angle/ssm/k states are fp32, final v has v's dtype. ``precision="ieee"`` (default) gives fp32-exact dots for
fp32 inputs, ``"tf32"`` is an explicit opt-in. 16-bit inputs use 16-bit dot operands with fp32 accumulation.
"""
from __future__ import annotations

import torch
import triton.language as tl

from mamba3.dispatch import DeviceSpec

from ..checks import on_device_of
from ..common.chunking import make_chunks
from ..common.cumsum import angle_backward, angle_offsets, chunk_sums, rotation_planes
from ..common.launch import launch
from ..common.state_passing import state_passing, state_slabs
from .bwd import bwd_dqk_kernel, bwd_dv_kernel, decay_grad_kernel, trap_grad_kernel
from .configs import choose_config, gradient_launch_options, problem_for
from .fwd import chunk_state_kernel, chunk_state_scan_kernel, output_kernel

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# The interpreter has no device: choose as for the smallest opt-in budget any supported GPU has.
_INTERPRETER_SPEC = DeviceSpec(name="interpreter", arch=0, smem_optin=101_376)


_CONFIG_OVERRIDE = None  # tests only: force a SisoConfig (e.g. small bn/bp to exercise multi-block loops)
_SPEC_OVERRIDE: DeviceSpec | None = None  # set by configs.aot_launches while recording launches for an arch


def _spec(x):
    if _SPEC_OVERRIDE is not None:
        return _SPEC_OVERRIDE
    if x.is_cuda:
        from mamba3.dispatch import device_spec

        return device_spec(x.device)
    return _INTERPRETER_SPEC


def _c(x):
    return None if x is None else x.contiguous()


class _Ctx:
    """Sizes, strides and config shared by the launches of one call."""

    def __init__(self, q, v, angles, adt, chunk_size, cu_seqlens, precision):
        B, T, G, N = q.shape
        H, P = v.shape[2], v.shape[3]
        self.B, self.T, self.G, self.N, self.H, self.P = B, T, G, N, H, P
        self.HPG = H // G
        self.A = angles.shape[-1]
        spec = _spec(v)
        self.sm_count = spec.sm_count
        self.arch = spec.arch
        # launch options of the two gradient kernels (sm_80: an explicit register cap)
        self.bwd_options = gradient_launch_options(spec.arch)
        self.cfg = _CONFIG_OVERRIDE or choose_config(spec, problem_for(q, v, chunk_size))
        self.chunks = make_chunks(B, T, self.cfg.chunk, cu_seqlens, v.device)
        self.dot_dt = _TL[v.dtype] if v.dtype != torch.float32 and self.cfg.half_dots else tl.float32
        # fp32 dot operands: the config's fp32-accurate mode (IEEE FMA or tf32x3 tensor-core dots) unless the
        # caller opted into tf32; 16-bit operands ignore it
        self.prec = "tf32" if precision == "tf32" else self.cfg.fp32_prec
        # halves move between memory and registers by stride-2 loads and stores (SisoConfig.contiguous_halves off)
        self.strided = self.cfg.halves and not self.cfg.contiguous_halves
        if N % 2 or N < 16 or (N & (N - 1)) or P < 16 or (P & (P - 1)):
            raise ValueError(f"SISO Triton kernels need N and P powers of two ≥ 16, got N={N}, P={P}")
        # tensors are contiguous: batch strides are T × these (derived in the kernels, see fwd.py)
        self.sq_t = G * N
        self.sv_t = H * P


def _head_split(hpg: int, most: int, programs_per_split: int, sm_count: int | None) -> int:
    """How many programs share the heads of one q/k group in bwd_dqk: the largest divisor of H/G that is ≤ most
    (``SisoConfig.head_split``), or a smaller divisor ≥ 2 when that still gives every SM 8 programs
    (programs_per_split: the grid of one split, chunks × groups × N blocks). Every split writes a whole fp32 dq and
    dk that the host sums, so fewer splits move less where the grid is already full (H200, B8 T4096 H32, one
    forward+backward: 8 → 4 → 2 splits 7.47 → 7.37 → 7.35 ms, bwd_dqk 2.42 → 2.35 → 2.34, the partials' sum
    0.150 → 0.119 → 0.108; `sweep_siso.py`), while small grids keep more programs in flight. 1 (writing dq/dk
    directly, another specialisation) only when H/G allows nothing else, so the choice never recompiles."""
    divisors = [d for d in range(1, min(hpg, most) + 1) if hpg % d == 0]
    if sm_count:
        for d in divisors:
            if d >= 2 and d * programs_per_split >= 8 * sm_count:
                return d
    return divisors[-1]


def _scan_states(ctx) -> bool:
    """Whether the chunk states and their pass run as one scan (``chunk_state_scan_kernel``, one program per
    sequence, head and state block) or chunk-parallel and then ``state_passing``. ``SisoConfig.scan_states`` True /
    False decides; None (the dispatcher's): the scan on the 16-bit-dot path of dense batches when it gives every SM 1.5
    programs or more. H200, bf16, B·T = 32768 tokens, H = 32, N = 128, P = 64, forward+backward, scan / chunked
    (seventeenth session, ``sweep_siso.py``): B8 (512 programs) 6.81 / 7.32 ms, B4 (256) 6.89 / 7.39, B2 (128)
    7.63 / 7.38, B1 (64) 9.45 / 7.50. The fp32 path's scan was no faster (B8 42.6 / 42.3 ms) and stays chunked, as
    do sequences of unequal lengths (the longest one would set the scan's time) and devices of unknown SM count."""
    ch = ctx.chunks
    if ctx.cfg.scan_states is not None:
        return ctx.cfg.scan_states
    programs = ch.nseq * ctx.H * _state_blocks(ctx)
    return bool(ctx.dot_dt != tl.float32 and ch.equal_chunks and ctx.sm_count and 2 * programs >= 3 * ctx.sm_count)


def _s_init(ctx, dt, trap, input_states):
    """S_init = SSM_in + dt_0(1−λ_0)·V_in K_inᵀ per (sequence, head), fp32, and w0 = dt_0(1−λ_0)."""
    if input_states is None:
        return None, None
    _, ssm_in, k_in, v_in = input_states
    ch = ctx.chunks
    dt0 = dt[ch.seq_bidx, :, ch.seq_start_tok].float()  # (NS, H)
    lam0 = torch.sigmoid(trap[ch.seq_bidx, :, ch.seq_start_tok].float())
    w0 = dt0 * (1 - lam0)
    s0 = ssm_in.float() + w0[..., None, None] * v_in.float()[..., :, None] * k_in.float()[..., None, :]
    return s0.contiguous(), w0


def _chunk_sums(ctx, adt, dt, trap, angles, input_states, off=None):
    """Forward step 1: per-chunk decay sums, the per-token coefficient table (cs, γ, scale), the float64 θ offset
    of every chunk and the final angle state (None when ``off`` is given: the forward's offsets, reused by its
    backward, which needs no final angle)."""
    gsum, asum, coef = chunk_sums(adt, dt, trap, angles, ctx.chunks, ctx.H, ctx.A)
    if off is not None:
        return gsum, coef, off, None
    off, final_angle = angle_offsets(asum, ctx.chunks, None if input_states is None else input_states[0])
    return gsum, coef, off, final_angle


def _states(ctx, q, k, v, adt, dt, trap, q_bias, k_bias, angles, input_states, off=None, for_output=False,
            states=True):
    """Forward steps 1–3: θ offsets (``off``: already known), the per-token coefficient table (cs, γ, scale) and
    the state entering every chunk (nchunks, H, P, N): fp32, or with ``for_output`` (the forward, whose output
    kernel is the only reader) as ``_chunk_states`` stores them for the output kernel; without ``states`` (a
    backward with the forward's copy) None, and no final state."""
    ch = ctx.chunks
    H, A = ctx.H, ctx.A
    gsum, coef, off, final_angle = _chunk_sums(ctx, adt, dt, trap, angles, input_states, off)
    rot, plane = rotation_planes(angles, dt, off, ch, H, A)
    s0, w0 = _s_init(ctx, dt, trap, input_states)
    st = final_ssm = None
    if states:
        final_ssm = torch.empty(ch.nseq, H, ctx.P, ctx.N, device=v.device, dtype=torch.float32)
        st = _chunk_states(ctx, 0, v, None, k, k_bias, coef, rot, plane, gsum, s0, final_ssm, for_output=for_output)
    return (rot, plane), gsum, coef, st, final_angle, final_ssm, w0, off


def _state_blocks(ctx) -> int:
    return (ctx.N // ctx.cfg.bn) * (ctx.P // ctx.cfg.bp)


def _bwd_states16(ctx) -> bool:
    """Whether the backward's reverse state pass (the scan, or ``state_passing``) forms ⟨dSe, S⟩ and 16-bit copies of
    S and dS for the per-chunk gradient kernels (``SisoConfig.bwd_states16``): on the 16-bit-dot path (interleaved
    blocks) only."""
    return bool(ctx.cfg.bwd_states16 and ctx.dot_dt != tl.float32)


def _kend_blocks(ctx) -> int:
    """How many partials of e^{cs_L}⟨dSe, S⟩ per chunk the reverse pass leaves with ``_bwd_states16``: one per state
    block of the scan, or per slab of ``state_passing``."""
    if _scan_states(ctx):
        return _state_blocks(ctx)
    return state_slabs(ctx.P * ctx.N, ctx.cfg.state_block)


def _bwd_store_a1(ctx) -> bool:
    """Whether bwd_dv hands M∘(dY Vᵀ) to bwd_dqk: with one P block, where bwd_dv forms the whole C×C product in one
    program, or on fp32 operands with several as per-block shares where ``SisoConfig.bwd_store_a1_blocks``; on
    16-bit dots (interleaved pairs) where ``SisoConfig.bwd_store_a1``, on fp32 operands where ``bwd_store_a1_fp32``
    (the buffer then fp32)."""
    fp32 = ctx.dot_dt == tl.float32
    flag = ctx.cfg.bwd_store_a1_fp32 if fp32 else ctx.cfg.bwd_store_a1
    return bool(flag and (ctx.P == ctx.cfg.bp or fp32 and ctx.cfg.bwd_store_a1_blocks))


def _chunk_states(ctx, mode, x, z, k, k_bias, coef, rot, plane, gsum, init, final, for_output=False, kend=None):
    """MODE 0: the state entering every chunk (nchunks, H, P, N; computed in fp32), from init (NS, H, P, N, or None
    for 0), final state into ``final`` (fp32); MODE 1 (x = dO, z, k = q): the fp32 dS leaving every chunk, the pass
    in reverse from init = dS_final, the gradient of the input state into ``final``. One scan kernel where
    ``_scan_states`` says so, else the chunk-parallel local terms (fp32) and ``common.state_passing``.
    ``for_output`` (the forward's states, read only by the output kernel, which rounds them to its 16-bit dot dtype):
    with ``SisoConfig.states16`` they are stored in that dtype (bit-identical results; the chunk-parallel path's local
    terms stay fp32 in a buffer of their own). ``kend`` (MODE 1 where ``_bwd_states16``): (states S, a 16-bit buffer
    for their copy, the (``_kend_blocks``, nchunks, H) fp32 partials of e^{cs_L}⟨dSe, S⟩), S the fp32 ones of MODE 0,
    or the forward's 16-bit copy with None for the buffer (nothing to copy); dS is then stored in the copy's (the
    dot) dtype."""
    ch, cfg = ctx.chunks, ctx.cfg
    H, N, P = ctx.H, ctx.N, ctx.P
    blocks = _state_blocks(ctx)
    scan = _scan_states(ctx)
    # a 16-bit dot dtype means the interleaved 16-bit-dot path (half_dots; never halves), whose dot dtype is the
    # input's (x = v; with kend, that of the copy buffer, which has v's dtype)
    states16 = for_output and cfg.states16 and ctx.dot_dt != tl.float32
    if kend is not None:  # dS in the copy's dtype: the S16 buffer's, or that of the forward's copy
        dtype = (kend[1] if kend[1] is not None else kend[0]).dtype
    else:
        dtype = x.dtype if states16 else torch.float32
    st = torch.empty(ch.nchunks, H, P, N, device=x.device, dtype=dtype)
    # the chunk-parallel path's local terms: fp32, in st itself unless st is a 16-bit copy
    local = st if scan or dtype == torch.float32 else torch.empty_like(st, dtype=torch.float32)
    common = (x, z if z is not None else x, k, k_bias if k_bias is not None else k, coef, coef.stride(0), rot, plane,
              local)
    meta = dict(N=N, P=P, C=cfg.chunk, BN=cfg.bn, BP=cfg.bp, MODE=mode, HAS_Z=z is not None,
                HAS_BIAS=k_bias is not None, HALVES=cfg.halves, DOT_DT=ctx.dot_dt, PREC=ctx.prec, STRIDED=ctx.strided,
                num_warps=cfg.warps_chunk, num_stages=cfg.stages)
    assert kend is None or mode == 1 and ctx.dot_dt != tl.float32, "kend: see _bwd_states16"
    if scan:
        fwd, fwd16, parts = kend if kend is not None else (st, st, st)
        launch(chunk_state_scan_kernel, (ch.nseq * H * blocks,), *common, gsum,
               init if init is not None else st, final, fwd, fwd16 if fwd16 is not None else fwd, parts,
               ch.chunk_table, ch.seq_table, ch.max_chunks, parts.stride(0), ctx.T, ctx.sv_t, ctx.sq_t, H, ctx.HPG,
               ctx.A, **meta, HAS_INIT=init is not None, REVERSE=mode == 1, KEND=kend is not None,
               COPY_S=fwd16 is not None, PREFETCH=cfg.scan_prefetch[0 if for_output else 1 + mode])
    else:
        launch(chunk_state_kernel, (ch.nchunks * H * blocks,), *common, ch.chunk_table, ctx.T, ctx.sv_t, ctx.sq_t,
               H, ctx.HPG, ctx.A, **meta)
        state_passing(local, gsum, ch.seq_table, ch.max_chunks, init=init, final=final, reverse=mode == 1,
                      block=cfg.state_block, out=st, kend=kend)
    return st


class SisoTritonFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, ang_in, ssm_in, k_in, v_in,
                cu_seqlens, chunk_size, precision, save_states=False):
        tensors = [_c(x) for x in (q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z)]
        q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z = tensors
        has_states = ssm_in is not None
        input_states = (_c(ang_in), _c(ssm_in), _c(k_in), _c(v_in)) if has_states else None
        c = _Ctx(q, v, angles, adt, chunk_size, cu_seqlens, precision)
        ch, cfg = c.chunks, c.cfg
        ctx.set_materialize_grads(False)
        out = torch.empty_like(v)
        (rot, plane), gsum, coef, st, final_angle, final_ssm, _, off = _states(
            c, q, k, v, adt, dt, trap, q_bias, k_bias, angles, input_states, for_output=True)
        # save_states: the 16-bit states the output kernel reads, kept where the backward's reverse pass would
        # otherwise compute them again (_bwd_states16) and round them to this dtype
        kept = st if save_states and st.dtype != torch.float32 and _bwd_states16(c) else None
        ctx.save_for_backward(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z,
                              *(input_states if has_states else (None,) * 4), kept)
        # sizes, config and chunk tables (no second host sync for varlen), and the chunks' θ offsets (nchunks, H, A)
        ctx.meta = (c, has_states, off)
        unroll_qk, unroll_s = cfg.output_unroll_factors(c.arch)
        launch(output_kernel, (ch.nchunks * c.H * (c.P // cfg.bp),),
            q, k, v, z if z is not None else v, out, q_bias if q_bias is not None else q,
            k_bias if k_bias is not None else k, D if D is not None else v, coef, coef.stride(0), rot, plane, st,
            ch.chunk_table, c.T, c.sq_t, c.sv_t, c.H, c.HPG, c.A,
            N=c.N, P=c.P, C=cfg.chunk, BN=cfg.bn, BP=cfg.bp, HAS_Z=z is not None, HAS_D=D is not None,
            HAS_BIAS=q_bias is not None, HALVES=cfg.halves, DOT_DT=c.dot_dt, PREC=c.prec, STRIDED=c.strided,
            UNROLL_QK=unroll_qk, UNROLL_S=unroll_s, num_warps=cfg.warps_chunk, num_stages=cfg.stages)
        return out, final_angle.to(torch.float32), final_ssm

    @staticmethod
    def backward(ctx, dout, dfa, dfssm):
        (q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, ang_in, ssm_in, k_in, v_in, kept) = ctx.saved_tensors
        c, has_states, off = ctx.meta
        input_states = (ang_in, ssm_in, k_in, v_in) if has_states else None
        return _backward(c, (q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z), input_states, dout, dfa, dfssm,
                         off, kept) + (None,)


def _backward(c, tensors, input_states, dout, dfa, dfssm, off=None, kept=None):
    """SisoTritonFn's gradients (every input's, in its order) from its output gradients: recomputes the chunk
    states (from the forward's θ offsets ``off`` when given; with ``kept``, the forward's 16-bit states, not at
    all), the reverse state pass, the two per-chunk gradient kernels and the angle backward."""
    q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z = tensors
    has_states = input_states is not None
    if has_states:
        ang_in, ssm_in, k_in, v_in = input_states
    ch, cfg = c.chunks, c.cfg
    H, N, P, A, B, T = c.H, c.N, c.P, c.A, c.B, c.T
    dev = v.device
    if dout is None:
        dout = torch.zeros_like(v)
    dout = dout.contiguous()
    (rot, plane), gsum, coef, st, _, _, w0, _ = _states(c, q, k, v, adt, dt, trap, q_bias, k_bias, angles,
                                                        input_states, off, states=kept is None)
    # local dS per chunk and the reverse state pass: the dS arriving at the end of every chunk
    ds_init = torch.empty(ch.nseq, H, P, N, device=dev, dtype=torch.float32)
    ds_final = None if dfssm is None else dfssm.float().contiguous()
    npb = P // cfg.bp
    # e^{cs_L}⟨dSe, S⟩ per chunk, in partials: bwd_dv's per P block, or with bwd_states16 the reverse pass's per
    # state block or slab (it then leaves 16-bit copies of S and dS for the two per-chunk kernels)
    bwd16 = _bwd_states16(c)
    assert kept is None or bwd16, "the forward keeps 16-bit states only for the reverse pass of _bwd_states16"
    kend = torch.empty(_kend_blocks(c) if bwd16 else npb, ch.nchunks, H, device=dev, dtype=torch.float32)
    if kept is not None:  # ⟨dSe, S⟩ from the forward's 16-bit states, which the per-chunk kernels read
        dst = _chunk_states(c, 1, dout, z, q, q_bias, coef, rot, plane, gsum, ds_final, ds_init,
                            kend=(kept, None, kend))
        st = kept
    elif bwd16:
        st16 = torch.empty_like(st, dtype=v.dtype)
        dst = _chunk_states(c, 1, dout, z, q, q_bias, coef, rot, plane, gsum, ds_final, ds_init,
                            kend=(st, st16, kend))
        st = st16
    else:
        dst = _chunk_states(c, 1, dout, z, q, q_bias, coef, rot, plane, gsum, ds_final, ds_init)
    # per-chunk gradients
    dv = torch.empty_like(v)
    dz = torch.empty_like(z) if z is not None else None
    ddp = torch.empty(npb, ch.nchunks, H, device=dev, dtype=torch.float32)
    dgam = torch.empty(npb, B, H, T, device=dev, dtype=torch.float32)  # every token is written
    # per P block: the gradient w.r.t. the within-chunk cumsum cs and the K-into-state term (both per token);
    # decay_grad_kernel scans them into d adt
    gcs = torch.empty(npb, B, H, T, device=dev, dtype=torch.float32)
    bterm = torch.empty_like(gcs)
    # dy = dO ⊙ silu(z): written by bwd_dv, read by bwd_dqk; without z it is dO. In dO's dtype, except fp16,
    # which keeps fp32 (dO·silu(z) may overflow fp16 where dO and z do not)
    dy_dtype = torch.float32 if dout.dtype == torch.float16 else dout.dtype
    dy = torch.empty_like(dout, dtype=dy_dtype) if z is not None else dout
    store_a1 = _bwd_store_a1(c)
    # one tile per (chunk, head) and P block (one block on 16-bit dots), in the dot dtype; bwd_dqk sums the shares
    a1_dtype = torch.float32 if c.dot_dt == tl.float32 else v.dtype
    a1 = torch.empty(ch.nchunks, H, npb, cfg.chunk, cfg.chunk, device=dev, dtype=a1_dtype) if store_a1 else dy
    launch(bwd_dv_kernel, (ch.nchunks * H * npb,), 
        q, k, v, z if z is not None else v, dout, dv, dz if dz is not None else dv, dy,
        q_bias if q_bias is not None else q, k_bias if k_bias is not None else k, D if D is not None else v,
        coef, coef.stride(0), rot, plane, st, dst, ddp, dgam, gcs, bterm, kend, a1,
        ch.chunk_table, T, B, ddp.stride(0), c.sq_t, c.sv_t, H, c.HPG, A,
        N=N, P=P, C=cfg.chunk, BN=cfg.bn, BP=cfg.bp, HAS_Z=z is not None, HAS_D=D is not None,
        HAS_BIAS=q_bias is not None, HALVES=cfg.halves, DOT_DT=c.dot_dt, PREC=c.prec, KEND=not bwd16,
        STORE_A1=store_a1, STRIDED=c.strided, num_warps=cfg.warps_bwd, num_stages=cfg.stages, **c.bwd_options)
    dadt = torch.empty(B, H, T, device=dev, dtype=torch.float32)  # every token is written
    launch(decay_grad_kernel, (ch.nchunks * H,), gcs, bterm, kend, dadt, ch.chunk_table, T, B, kend.stride(0), H,
           NPB=npb, NKE=kend.shape[0], C=cfg.chunk, num_warps=1)
    del gcs, bterm, kend
    nbk = N // cfg.bn
    hs = _head_split(c.HPG, cfg.head_split, ch.nchunks * c.G * nbk, c.sm_count)
    if hs == 1:
        dq, dk = torch.empty_like(q), torch.empty_like(k)
    else:
        dq = torch.empty((hs,) + tuple(q.shape), device=dev, dtype=torch.float32)
        dk = torch.empty_like(dq)
    dsc = torch.empty(nbk, B, H, T, device=dev, dtype=torch.float32)
    has_bias = q_bias is not None
    dbq = torch.empty(ch.nchunks, H, N, device=dev, dtype=torch.float32) if has_bias else dsc
    dbk = torch.empty(ch.nchunks, H, N, device=dev, dtype=torch.float32) if has_bias else dsc
    R = torch.empty(B, T, H, max(A, 1), device=dev, dtype=torch.float32)  # every (token, angle) is written
    launch(bwd_dqk_kernel, (ch.nchunks * c.G * hs * nbk,), 
        q, k, v, dy, dq, dk, q_bias if has_bias else q, k_bias if has_bias else k,
        coef, coef.stride(0), rot, plane, st, dst, dsc, dbq, dbk, R, a1,
        ch.chunk_table, T, B, c.sq_t, c.sv_t, H, c.HPG, hs, A,
        N=N, P=P, C=cfg.chunk, BN=cfg.bn, BP=cfg.bp, HAS_BIAS=has_bias,
        HALVES=cfg.halves, DOT_DT=c.dot_dt, PREC=c.prec, LOAD_A1=store_a1, STRIDED=c.strided,
        num_warps=cfg.warps_bwd, num_stages=cfg.stages, **c.bwd_options)
    del st, dst, rot, dy, a1
    if hs > 1:
        dq, dk = dq.sum(0).to(q.dtype), dk.sum(0).to(k.dtype)
    # angle path (adds the cross-chunk part of dθ)
    if A > 0:
        dang, ddt_ang, dang_in = angle_backward(R[..., :A], dfa, angles, dt, ch, H, A)
    else:
        dang, ddt_ang, dang_in = torch.zeros_like(angles, dtype=torch.float32), None, None
    grads_states = (None,) * 4
    dw0 = None
    if has_states:
        dssm_in = ds_init
        vi, ki = v_in.float(), k_in.float()
        dk_in = w0[..., None] * torch.einsum("shpn,shp->shn", ds_init, vi)
        dv_in = w0[..., None] * torch.einsum("shpn,shn->shp", ds_init, ki)
        dw0 = torch.einsum("shpn,shp,shn->sh", ds_init, vi, ki).contiguous()
        grads_states = (None if dang_in is None else dang_in.to(ang_in.dtype), dssm_in.to(ssm_in.dtype),
                        dk_in.to(k_in.dtype), dv_in.to(v_in.dtype))
    # trapezoid coefficients γ_t = λ_t dt_t, scale_{t−1} ∋ (1 − λ_t) dt_t: d dt and d trap from the partials
    ddt = torch.empty_like(dt)
    dtrap = torch.empty_like(trap)
    launch(trap_grad_kernel, (ch.nchunks * H,), dsc, dgam, dt, trap, ddt_ang if ddt_ang is not None else dsc,
           dw0 if dw0 is not None else dsc, ch.seq_start_tok, ddt, dtrap, ch.chunk_table, T, B, H,
           NBK=nbk, NPB=npb, C=cfg.chunk, HAS_ANG=ddt_ang is not None, HAS_W0=dw0 is not None, num_warps=1)
    dD = ddp.sum((0, 1)).to(D.dtype) if D is not None else None
    dqb = dbq.sum(0).to(q_bias.dtype) if has_bias else None
    dkb = dbk.sum(0).to(k_bias.dtype) if has_bias else None
    if has_states and grads_states[0] is None:
        grads_states = (torch.zeros_like(ang_in),) + grads_states[1:]
    return (dq, dk, dv, dadt.to(adt.dtype), ddt, dtrap, dqb, dkb,
            dang.to(angles.dtype), dD, dz, *grads_states, None, None, None)


@on_device_of
def siso_triton(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states, chunk_size, cu_seqlens,
                precision, final_states=True, save_states=False):
    """SISO Mamba-3 on the Triton kernels. Returns (out, (angle, ssm, k, v) final states), or (out, None) with
    final_states=False (the final k̃ and v are torch ops the caller would discard); see ARCHITECTURE.md.
    ``save_states``: :func:`mamba3.mamba3_siso`'s."""
    if v.dtype == torch.float64 or q.dtype == torch.float64:
        raise TypeError("the SISO Triton kernels compute in fp32; use backend='reference' for float64 inputs")
    q_bias, k_bias = _both_biases(q_bias, k_bias)
    ins = input_states if input_states is not None else (None, None, None, None)
    out, fa, fs = SisoTritonFn.apply(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, *ins,
                                     cu_seqlens, chunk_size, precision, save_states)
    if not final_states:
        return out, None
    # final k̃ and v: O(NS·H·N) torch ops on the last token of every sequence (autograd routes their gradients,
    # the angle part into the final angle state's gradient, which the Function handles)
    last = _last_tokens(v, cu_seqlens)
    fk = _rotate_pairs(_final_k_input(k, k_bias, last, v.shape[2]), fa)
    return out, (fa, fs, fk, v[last])


@on_device_of
def siso_triton_backward(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z, input_states, chunk_size,
                         cu_seqlens, precision, final_angle, grads):
    """What autograd through :func:`siso_triton` returns, without running its forward (the ``mamba3::siso`` custom
    op's backward): the gradients of q … z and of the input states' four tensors (15 entries, None for an absent
    tensor), from grads = the gradients of (out, angle, ssm, k, v) (each may be None) and the final angle state the
    forward returned. The final k̃ = R(θ_final)(k_last + k_bias) is differentiated here, by the formulas autograd
    uses (so a compiled step gives the eager gradients), the rest by :class:`SisoTritonFn`'s backward."""
    given = (q_bias is not None, k_bias is not None)
    q_bias, k_bias = _both_biases(q_bias, k_bias)
    tensors = tuple(_c(x) for x in (q, k, v, adt, dt, trap, q_bias, k_bias, angles, D, z))
    states = None if input_states is None else tuple(_c(x) for x in input_states)
    dout, dfa, dfssm, dfk, dfv = grads
    last = _last_tokens(v, cu_seqlens)
    dkl = None
    if dfk is not None:
        dkl, dtheta = _rotate_pairs_backward(_final_k_input(k, k_bias, last, v.shape[2]), final_angle, dfk)
        dfa = dtheta if dfa is None else dfa + dtheta
    c = _Ctx(tensors[0], tensors[2], tensors[8], tensors[3], chunk_size, cu_seqlens, precision)
    g = list(_backward(c, tensors, states, dout, dfa, dfssm)[:15])
    if dkl is not None:  # autograd's order: to k's dtype, then the sum over a group's heads
        ns, heads, n = dkl.shape
        g[1][last] += dkl.to(k.dtype).view(ns, k.shape[2], heads // k.shape[2], n).sum(2)
        g[7] = g[7] + dkl.sum(0).to(k_bias.dtype)
    if dfv is not None:
        g[2][last] += dfv
    for i, present in ((6, given[0]), (7, given[1])):
        if not present:  # a bias the caller left out (zeros above) has no gradient
            g[i] = None
    return g


def _both_biases(q_bias, k_bias):
    """The kernels take both biases or none: a missing one is zeros."""
    if (q_bias is None) != (k_bias is None):
        zeros = torch.zeros_like(k_bias if q_bias is None else q_bias)
        q_bias = zeros if q_bias is None else q_bias
        k_bias = zeros if k_bias is None else k_bias
    return q_bias, k_bias


def _last_tokens(v, cu_seqlens):
    """The index of every sequence's last token in (B, T, …) tensors."""
    if cu_seqlens is None:
        return (slice(None), -1)
    return (0, (cu_seqlens[1:].long() - 1).to(v.device, non_blocking=True))  # a host cu_seqlens: no sync


def _final_k_input(k, k_bias, last, nheads):
    """k + k_bias at every sequence's last token, per head, fp32 (NS, H, N): what the final k̃ state rotates."""
    kl = k[last].repeat_interleave(nheads // k.shape[2], dim=1).float()
    return kl if k_bias is None else kl + k_bias.float()


def _rotate_pairs(x, theta):
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x (…, N) by θ (…, A); dims ≥ 2A pass through."""
    A = theta.shape[-1]
    if A == 0:
        return x
    pairs = x[..., : 2 * A].unflatten(-1, (A, 2))
    xe, xo = pairs[..., 0], pairs[..., 1]
    c, s = torch.cos(theta), torch.sin(theta)
    rot = torch.stack((xe * c - xo * s, xe * s + xo * c), -1).flatten(-2)
    return torch.cat((rot, x[..., 2 * A:]), -1)


def _rotate_pairs_backward(x, theta, dy):
    """(dx, dθ) of y = _rotate_pairs(x, θ) for dy, as autograd computes them."""
    A = theta.shape[-1]
    dy = dy.to(x.dtype)
    if A == 0:
        return dy, torch.zeros_like(theta)
    xe, xo = x[..., : 2 * A].unflatten(-1, (A, 2)).unbind(-1)
    dye, dyo = dy[..., : 2 * A].unflatten(-1, (A, 2)).unbind(-1)
    c, s = torch.cos(theta), torch.sin(theta)
    dx = torch.stack((dye * c + dyo * s, dyo * c - dye * s), -1).flatten(-2)
    dtheta = (dyo * xe - dye * xo) * c - (dye * xe + dyo * xo) * s
    return torch.cat((dx, dy[..., 2 * A:]), -1), dtheta
