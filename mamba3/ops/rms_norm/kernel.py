"""RMS norm kernels: one launch forward, one backward (plus the host's sum of the weight-gradient partials).

Rows of W = G·D contiguous elements (G groups of D, normalised each on its own; G = 1: the whole row); x's rows
may be strided (a slice of a wider projection is read in place), every other tensor is contiguous. A program
holds a [BLOCK_M, BLOCK_G, BLOCK_D] tile (rows × groups × dims, powers of two, masked to G and D), computes in
fp32 whatever the input dtype:

    forward:   r = 1 / sqrt(mean_d x² + eps) per (row, group),  n = x·r·w,  y = n (· silu(z) with a gate)
    backward:  dn = dy (· silu(z)),  dz = dy·n·σ(z)(1 + z(1 − σ(z))),  g = dn·w,
               dx = r·(g − x̂·mean_d(g·x̂)) with x̂ = x·r,  dw = Σ_rows dn·x̂ (a partial per program)

The backward's programs walk row blocks pid, pid + nprog, … and keep their dw partial in registers, so the
partials are few (nprog × W fp32) whatever the number of rows.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_offsets(row0, rows, sx, G, D, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """(element offsets [BM, BG, BD] in the contiguous tensors, the same in x (row stride sx), their mask, column
    offsets [BG, BD], column mask, row ids [BM])."""
    r = row0 + tl.arange(0, BLOCK_M)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    col = g[:, None] * D + d[None, :]
    cmask = (g[:, None] < G) & (d[None, :] < D)
    r64 = r.to(tl.int64)[:, None, None]
    mask = (r < rows)[:, None, None] & cmask[None, :, :]
    return r64 * (G * D) + col[None, :, :], r64 * sx + col[None, :, :], mask, col, cmask, r


@triton.jit(do_not_specialize=["rows", "sx"])
def rms_norm_fwd_kernel(x_ptr, w_ptr, z_ptr, y_ptr, rstd_ptr, rows, sx, G, D, eps,
                        BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                        HAS_W: tl.constexpr, HAS_Z: tl.constexpr):
    row0 = tl.program_id(0).to(tl.int64) * BLOCK_M
    offs, xoffs, mask, col, cmask, r = _tile_offsets(row0, rows, sx, G, D, BLOCK_M, BLOCK_G, BLOCK_D)
    x = tl.load(x_ptr + xoffs, mask=mask, other=0.0).to(tl.float32)
    # IEEE square root and division: the row's scale is exact to rounding, as the fp32 reference's
    rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, 2) / D + eps))  # [BM, BG]
    y = x * rstd[:, :, None]
    if HAS_W:
        y = y * tl.load(w_ptr + col, mask=cmask, other=0.0).to(tl.float32)[None, :, :]
    if HAS_Z:
        z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    g = tl.arange(0, BLOCK_G)
    tl.store(rstd_ptr + r[:, None] * G + g[None, :], rstd, mask=(r < rows)[:, None] & (g < G)[None, :])


@triton.jit(do_not_specialize=["rows", "nblocks", "sx"])
def rms_norm_bwd_kernel(x_ptr, w_ptr, z_ptr, dy_ptr, rstd_ptr, dx_ptr, dz_ptr, dw_ptr, rows, nblocks, sx, G, D,
                        BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                        HAS_W: tl.constexpr, HAS_Z: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    col = g[:, None] * D + d[None, :]
    cmask = (g[:, None] < G) & (d[None, :] < D)
    if HAS_W:
        w = tl.load(w_ptr + col, mask=cmask, other=0.0).to(tl.float32)[None, :, :]
    dw = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for blk in range(pid, nblocks, nprog):
        offs, xoffs, mask, col, cmask, r = _tile_offsets(blk * BLOCK_M, rows, sx, G, D, BLOCK_M, BLOCK_G, BLOCK_D)
        rmask = (r < rows)[:, None] & (g < G)[None, :]
        x = tl.load(x_ptr + xoffs, mask=mask, other=0.0).to(tl.float32)
        dn = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + r[:, None] * G + g[None, :], mask=rmask, other=0.0)
        xh = x * rstd[:, :, None]
        if HAS_Z:
            z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            s = tl.sigmoid(z)
            n = xh
            if HAS_W:
                n = xh * w
            tl.store(dz_ptr + offs, (dn * n * s * (1.0 + z * (1.0 - s))).to(dz_ptr.dtype.element_ty), mask=mask)
            dn = dn * z * s
        gx = dn
        if HAS_W:
            dw += tl.sum(dn * xh, 0)
            gx = dn * w
        dx = rstd[:, :, None] * (gx - xh * (tl.sum(gx * xh, 2) / D)[:, :, None])
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if HAS_W:
        tl.store(dw_ptr + pid * (G * D) + col, dw, mask=cmask)
