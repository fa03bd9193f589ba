"""Self-test of the interpreter lane: the bf16 patch is installed and the operations our kernels use give the
right numbers under TRITON_INTERPRET=1. If a Triton upgrade changes the interpreter internals, this fails.

Each kernel runs as a single program (the interpreter costs ~ms per program instance).
"""

import pytest
import torch
import triton
import triton.language as tl

from mamba3.testing import interpreter, rel_frobenius

BF16, F32 = torch.bfloat16, torch.float32


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                PRECISION: tl.constexpr):
    o_m = tl.arange(0, M)
    o_n = tl.arange(0, N)
    o_k = tl.arange(0, K)
    b_a = tl.load(a_ptr + o_m[:, None] * K + o_k[None, :])  # [M, K]
    b_b = tl.load(b_ptr + o_k[:, None] * N + o_n[None, :])  # [K, N]
    acc = tl.zeros((M, N), dtype=tl.float32)
    acc = tl.dot(b_a, b_b, acc, input_precision=PRECISION)  # [M, N]
    tl.store(c_ptr + o_m[:, None] * N + o_n[None, :], acc)


@triton.jit
def _elementwise_kernel(x_ptr, y_ptr, z_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(x_ptr + o)
    y = tl.load(y_ptr + o)
    z = tl.load(z_ptr + o)
    tl.store(out_ptr + 0 * N + o, x + y)
    tl.store(out_ptr + 1 * N + o, x - y)
    tl.store(out_ptr + 2 * N + o, x * y)
    tl.store(out_ptr + 3 * N + o, x / y)
    tl.store(out_ptr + 4 * N + o, tl.where(x > y, x, z))
    tl.store(out_ptr + 5 * N + o, tl.maximum(x, y))
    tl.store(out_ptr + 6 * N + o, tl.math.fma(x, y, z))
    tl.store(out_ptr + 7 * N + o, -x)


@triton.jit
def _reduce_kernel(x_ptr, sum_ptr, min_ptr, max_ptr, argmax_ptr, R: tl.constexpr, C: tl.constexpr):
    o_r = tl.arange(0, R)
    o_c = tl.arange(0, C)
    x = tl.load(x_ptr + o_r[:, None] * C + o_c[None, :])  # [R, C]
    tl.store(sum_ptr + o_r, tl.sum(x, axis=1))
    tl.store(min_ptr + o_r, tl.min(x, axis=1))
    tl.store(max_ptr + o_r, tl.max(x, axis=1))
    tl.store(argmax_ptr + o_r, tl.argmax(x, axis=1))


@triton.jit
def _add_combine(a, b):
    return a + b


@triton.jit
def _scan_kernel(x_ptr, cs_ptr, rcs_ptr, scan_ptr, rscan_ptr, R: tl.constexpr, C: tl.constexpr):
    o_r = tl.arange(0, R)
    o_c = tl.arange(0, C)
    offs = o_r[:, None] * C + o_c[None, :]
    x = tl.load(x_ptr + offs)  # [R, C]
    tl.store(cs_ptr + offs, tl.cumsum(x, axis=1))
    tl.store(rcs_ptr + offs, tl.cumsum(x, axis=1, reverse=True))
    tl.store(scan_ptr + offs, tl.associative_scan(x, 1, _add_combine))
    tl.store(rscan_ptr + offs, tl.associative_scan(x, 1, _add_combine, reverse=True))


@triton.jit
def _atomic_kernel(x_ptr, out_ptr, total_ptr, N: tl.constexpr):
    pid = tl.program_id(0)
    o = tl.arange(0, N)
    x = tl.load(x_ptr + pid * N + o)
    tl.atomic_add(out_ptr + o, x)
    tl.atomic_add(total_ptr, tl.sum(x, axis=0))


def _rand(*shape, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def test_patch_installed_and_hooked():
    assert interpreter.installed()
    hooked = interpreter.patched_methods()
    assert hooked and all(hooked.values()), f"bf16 patch not hooked: {hooked}"
    before = interpreter.patched_methods()
    interpreter.install()  # idempotent: no double wrapping
    assert interpreter.patched_methods() == before
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(_dot_kernel, InterpretedFunction), type(_dot_kernel)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_dot_bf16_and_fp32_ieee(dtype):
    M, N, K = 32, 16, 64
    a, b = _rand(M, K, dtype=dtype, seed=1), _rand(K, N, dtype=dtype, seed=2)
    c = torch.empty(M, N)
    _dot_kernel[(1,)](a, b, c, M, N, K, "ieee")
    ref = a.double() @ b.double()
    assert rel_frobenius(c, ref) < 1e-6, rel_frobenius(c, ref)


@pytest.mark.parametrize("precision", ["tf32", "tf32x3"])
def test_dot_fp32_tf32_modes(precision):
    # the interpreter computes every fp32 dot in full fp32 (the GPU rounds to tf32): exact here
    M, N, K = 16, 32, 32
    a, b = _rand(M, K, seed=3), _rand(K, N, seed=4)
    c = torch.empty(M, N)
    _dot_kernel[(1,)](a, b, c, M, N, K, precision)
    assert rel_frobenius(c, a.double() @ b.double()) < 1e-6


def test_elementwise_bf16_exact():
    N = 256
    x, y, z = _rand(N, dtype=BF16, seed=5), _rand(N, dtype=BF16, seed=6), _rand(N, dtype=BF16, seed=7)
    y = torch.where(y.abs() < 0.05, torch.ones_like(y), y)  # keep x / y tame
    out = torch.empty(8, N, dtype=BF16)
    _elementwise_kernel[(1,)](x, y, z, out, N)
    xf, yf, zf = x.float(), y.float(), z.float()
    # torch bf16 ops compute in fp32 and round to nearest even, like the GPU: expect bit equality
    expected = {
        "add": x + y, "sub": x - y, "mul": x * y, "div": x / y, "where": torch.where(x > y, x, z),
        "maximum": torch.maximum(x, y), "fma": (xf * yf + zf).to(BF16), "neg": -x,
    }
    for i, (name, ref) in enumerate(expected.items()):
        assert torch.equal(out[i], ref), f"bf16 {name}: max abs err {(out[i].float() - ref.float()).abs().max()}"


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_reductions(dtype):
    R, C = 8, 64
    x = _rand(R, C, dtype=dtype, seed=8)
    s, mn, mx = (torch.empty(R, dtype=dtype) for _ in range(3))
    am = torch.empty(R, dtype=torch.int32)
    _reduce_kernel[(1,)](x, s, mn, mx, am, R, C)
    tol = 1e-2 if dtype == BF16 else 1e-6
    assert rel_frobenius(s, x.double().sum(1)) < tol, (s, x.double().sum(1))
    assert torch.equal(mn, x.min(1).values) and torch.equal(mx, x.max(1).values)
    assert torch.equal(am.long(), x.float().argmax(1))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_scans_forward_and_reverse(dtype):
    R, C = 4, 32
    x = _rand(R, C, dtype=dtype, seed=9)
    cs_dtype = F32 if dtype == BF16 else dtype  # tl.cumsum promotes bf16 to fp32
    cs, rcs = torch.empty(R, C, dtype=cs_dtype), torch.empty(R, C, dtype=cs_dtype)
    sc, rsc = torch.empty(R, C, dtype=dtype), torch.empty(R, C, dtype=dtype)
    _scan_kernel[(1,)](x, cs, rcs, sc, rsc, R, C)
    fwd = x.double().cumsum(1)
    rev = x.double().flip(1).cumsum(1).flip(1)
    assert rel_frobenius(cs, fwd) < 1e-6 and rel_frobenius(rcs, rev) < 1e-6
    tol = 2e-2 if dtype == BF16 else 1e-6  # bf16 associative_scan rounds after every combine
    assert rel_frobenius(sc, fwd) < tol, rel_frobenius(sc, fwd)
    assert rel_frobenius(rsc, rev) < tol, rel_frobenius(rsc, rev)


def test_atomic_add_across_programs():
    P, N = 8, 64
    x = _rand(P, N, seed=10)
    out, total = torch.zeros(N), torch.zeros(1)
    _atomic_kernel[(P,)](x, out, total, N)
    assert rel_frobenius(out, x.double().sum(0)) < 1e-6
    assert abs(total.item() - x.double().sum().item()) < 1e-4


@triton.jit
def _cast_kernel(x32_ptr, x64_ptr, i32_ptr, b_ptr, out_b_ptr, out_f_ptr, out_i_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    x32 = tl.load(x32_ptr + o)
    x64 = tl.load(x64_ptr + o)
    i32 = tl.load(i32_ptr + o)
    b = tl.load(b_ptr + o)
    tl.store(out_b_ptr + 0 * N + o, x32.to(tl.bfloat16))  # round to nearest even
    tl.store(out_b_ptr + 1 * N + o, x64.to(tl.bfloat16))
    tl.store(out_b_ptr + 2 * N + o, i32.to(tl.bfloat16))
    tl.store(out_b_ptr + 3 * N + o, x32.to(tl.bfloat16, fp_downcast_rounding="rtne"))
    tl.store(out_b_ptr + 4 * N + o, x32.to(tl.bfloat16, fp_downcast_rounding="rtz"))
    tl.store(out_f_ptr + 0 * N + o, b.to(tl.float32).to(tl.float64))
    tl.store(out_f_ptr + 1 * N + o, b.to(tl.float64))
    tl.store(out_i_ptr + o, b.to(tl.int32))


def test_casts_bf16():
    N = 128
    x32 = _rand(N, seed=11) * 100
    x64 = _rand(N, seed=12).double() * 100
    i32 = torch.arange(-N // 2, N // 2, dtype=torch.int32) * 37
    b = (_rand(N, seed=13) * 100).to(BF16)
    out_b = torch.empty(5, N, dtype=BF16)
    out_f = torch.empty(2, N, dtype=torch.float64)
    out_i = torch.empty(N, dtype=torch.int32)
    _cast_kernel[(1,)](x32, x64, i32, b, out_b, out_f, out_i, N)
    assert torch.equal(out_b[0], x32.to(BF16)), "fp32 -> bf16 must round to nearest even"
    assert torch.equal(out_b[1], x64.float().to(BF16)), "fp64 -> bf16"
    assert torch.equal(out_b[2], i32.to(BF16)), "int32 -> bf16"
    assert torch.equal(out_b[3], x32.to(BF16)), "fp32 -> bf16 rtne"
    rtz = (x32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(BF16)  # exact: low bits already zero
    assert torch.equal(out_b[4], rtz), "fp32 -> bf16 rtz"
    assert torch.equal(out_f[0], b.double()) and torch.equal(out_f[1], b.double()), "bf16 -> fp32/fp64"
    assert torch.equal(out_i, b.to(torch.int32)), "bf16 -> int32"


@triton.jit
def _runtime_bound_loop_kernel(bounds_ptr, x_ptr, out_ptr, BLOCK: tl.constexpr):
    # loop bounds loaded from memory and taken from the program id, as the chunked kernels do
    start = tl.load(bounds_ptr + tl.program_id(0))
    end = tl.load(bounds_ptr + tl.program_id(0) + 1)
    o = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(start, end):
        acc += tl.load(x_ptr + i * BLOCK + o)
    tl.store(out_ptr + tl.program_id(0) * BLOCK + o, acc)


def test_runtime_loop_bounds():
    """Loops whose bounds are runtime scalars (the interpreter's __index__ fix for NumPy ≥ 2.3)."""
    bounds = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    x = torch.randn(9, 8)
    out = torch.empty(3, 8)
    _runtime_bound_loop_kernel[(3,)](bounds, x, out, BLOCK=8)
    ref = torch.stack([x[0:3].sum(0), x[3:4].sum(0), x[4:9].sum(0)])
    assert rel_frobenius(out, ref) < 1e-6
