"""Host side of the Triton decode step: argument preparation and the two launches (no host synchronisation)."""
from __future__ import annotations

import contextlib

import torch

from .configs import StepProblem, choose_config, lane_sums_fit, next_pow2, writes_small_states


def _lastdim_contiguous(x):
    return x if x is None or x.stride(-1) == 1 else x.contiguous()


def build_launches(q, k, v, adt, dt, trap, q_bias, k_bias, mimo_v, mimo_z, mimo_out, angles, D, z,
                   angle_state, ssm_state, k_state, v_state, state_batch_indices, rms_norm, norm_weight, norm_eps,
                   *, siso, config=None, out=None):
    """([(kernel, args, meta, grid)] in launch order, out) of one step, in the rank-expanded layout of reference.py.

    siso=True: adjacent-pair rotation, output (B, H, P); else half-split rotation, output (B, H, P), or
    (B, R, H, P) when mimo_out is None.

    Inputs only need a unit stride in their last dimension (other strides are passed); small per-head tensors
    are made contiguous. States are used in place and must have a unit last-dimension stride.
    """
    from .kernel import mamba3_step_kernel, mamba3_step_rows_kernel

    bsz, nheads, headdim = v.shape
    rank, ngroups, dstate = q.shape[1], q.shape[2], q.shape[3]
    nangles = angles.shape[-1]
    if bsz > 65535:
        raise ValueError(f"step kernel: batch {bsz} exceeds the grid's 65,535 rows; split the batch")
    for name, s in (("angle", angle_state), ("ssm", ssm_state), ("k", k_state), ("v", v_state)):
        if s.stride(-1) != 1:
            raise ValueError(f"the {name} state must have a unit stride in its last dimension (it is updated in "
                             f"place), got strides {tuple(s.stride())}")
    q, k, v, z, angles = (_lastdim_contiguous(x) for x in (q, k, v, z, angles))
    adt, dt, trap = (x.contiguous() for x in (adt, dt, trap))
    q_bias, k_bias = q_bias.contiguous(), k_bias.contiguous()
    mimo_v, mimo_z, mimo_out, norm_weight, D = (None if x is None else x.contiguous()
                                                for x in (mimo_v, mimo_z, mimo_out, norm_weight, D))
    per_rank = not siso and mimo_out is None          # MIMO without mimo_out: (B, R, H, P)
    if out is None:
        shape = (bsz, rank, nheads, headdim) if per_rank else (bsz, nheads, headdim)
        out = torch.empty(shape, device=v.device, dtype=v.dtype)
    problem = StepProblem(headdim, dstate, rank, rms_norm=bool(rms_norm), row_heads=bsz * nheads)
    if config is None:
        config = choose_config(None, problem)
    if config.lane_sums and not lane_sums_fit(config, problem):
        raise ValueError(f"step kernel: lane_sums needs R = 2 or 4, 8 × 128 tiles in one warp and no RMSNorm, got "
                         f"R={rank}, {config}, rms_norm={bool(rms_norm)}")
    if rms_norm and config.block_p < headdim:
        raise ValueError(f"step kernel: the fused RMSNorm needs all of P={headdim} in one program, "
                         f"got block_p={config.block_p}")
    if config.row_tiles != 1 and config.block_n < dstate:
        raise ValueError(f"step kernel: row_tiles={config.row_tiles} needs whole rows per tile (block_n ≥ "
                         f"N={dstate}), got block_n={config.block_n}")
    if angles.dim() == 2:
        stride_angb, stride_angh = angles.stride(0), 0
    else:
        stride_angb, stride_angh = angles.stride(0), angles.stride(1)
    dummy = v                                         # the pointer passed for an absent optional tensor
    sbi = state_batch_indices if state_batch_indices is not None else dummy
    state_args = (
        q, k, v, z if z is not None else dummy, adt, dt, trap, angles,
        q_bias, k_bias, D if D is not None else dummy, mimo_v if mimo_v is not None else dummy,
        mimo_z if mimo_z is not None else dummy, mimo_out if mimo_out is not None else dummy,
        norm_weight if norm_weight is not None else dummy,
        angle_state, ssm_state, k_state, v_state, sbi, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), z.stride(0) if z is not None else 0, z.stride(1) if z is not None else 0,
        stride_angb, stride_angh,
        angle_state.stride(0), angle_state.stride(1), ssm_state.stride(0), ssm_state.stride(1),
        ssm_state.stride(2), k_state.stride(0), k_state.stride(1), k_state.stride(2),
        v_state.stride(0), v_state.stride(1),
        nheads, nheads // ngroups, headdim, nangles, float(norm_eps),
    )
    common = dict(N=dstate, R=rank, ADJACENT=bool(siso), HAS_SBI=state_batch_indices is not None)
    state_meta = dict(common, BLOCK_R=next_pow2(rank), BLOCK_P=config.block_p, BLOCK_N=config.block_n,
                      HAS_D=D is not None, HAS_Z=z is not None,
                      HAS_PSI=mimo_v is not None, HAS_ZETA=mimo_z is not None and z is not None,
                      HAS_PHI=mimo_out is not None, PER_RANK=per_rank, RMS_NORM=bool(rms_norm),
                      HAS_NW=norm_weight is not None, LANE_SUMS=config.lane_sums, num_warps=config.num_warps,
                      num_stages=config.num_stages)
    rows_args = (
        k, v, dt, angles, k_bias, angle_state, k_state, v_state, sbi,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), stride_angb, stride_angh,
        angle_state.stride(0), angle_state.stride(1), k_state.stride(0), k_state.stride(1), k_state.stride(2),
        v_state.stride(0), v_state.stride(1),
        nheads, nheads // ngroups, headdim, nangles,
    )
    rows_meta = dict(common, BLOCK_P=next_pow2(headdim), BLOCK_N=next_pow2(dstate), num_warps=config.rows_warps,
                     num_stages=1)
    rows_per_program = config.block_p * config.row_tiles
    write_small = writes_small_states(config, headdim, dstate)   # one program per (row, head)
    state_meta.update(ROW_TILES=config.row_tiles, WRITE_SMALL=write_small)
    # grids run the row tiles of a head fastest, then heads, then batch rows: consecutive programs stream
    # neighbouring parts of the (B, H, P, N) state (batch rows are H·P·N·4 bytes apart)
    launches = [(mamba3_step_kernel, state_args, state_meta, (-(-headdim // rows_per_program), nheads, bsz))]
    if not write_small:
        launches.append((mamba3_step_rows_kernel, rows_args, rows_meta, (nheads, bsz)))
    return launches, out


def step_triton(*args, siso, config=None, out=None):
    """Launch the step (arguments as build_launches). Returns the output; states are updated in place."""
    launches, out = build_launches(*args, siso=siso, config=config, out=out)
    # CPU tensors: the TRITON_INTERPRET=1 lane
    with torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext():
        for kernel, kargs, meta, grid in launches:
            kernel[grid](*kargs, **meta)
    return out
