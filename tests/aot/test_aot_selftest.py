"""Self-test of mamba3.testing.aot: the helper must reproduce the JIT's specialization and catch oversize configs.

Runs without a GPU (TRITON_INTERPRET must be unset: AOT needs JITFunctions). Keep the compile count small:
each compile costs ~0.3-1.3 s on the CI's 2 cores.
"""

import os

import pytest
import torch
import triton
import triton.language as tl

from mamba3.dispatch import OPTIN_SMEM, arch_spec, parse_arch
from mamba3.testing.aot import KernelLaunch, compile_launch, fits

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
               stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    o_m = pid_m * BM + tl.arange(0, BM)
    o_n = pid_n * BN + tl.arange(0, BN)
    o_k = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)  # [BM, BN]
    for k0 in range(0, K, BK):
        m_a = (o_m[:, None] < M) & (k0 + o_k[None, :] < K)
        m_b = (k0 + o_k[:, None] < K) & (o_n[None, :] < N)
        b_a = tl.load(a_ptr + o_m[:, None] * stride_am + (k0 + o_k[None, :]) * stride_ak, mask=m_a, other=0.0)
        b_b = tl.load(b_ptr + (k0 + o_k[:, None]) * stride_bk + o_n[None, :] * stride_bn, mask=m_b, other=0.0)
        acc += tl.dot(b_a, b_b)
    m_c = (o_m[:, None] < M) & (o_n[None, :] < N)
    tl.store(c_ptr + o_m[:, None] * stride_cm + o_n[None, :] * stride_cn, acc, mask=m_c)


def _mm_launch(dtype, BM, BN, BK, num_stages, num_warps=4):
    M = N = K = 1024  # representative: multiples of 16, unit inner strides
    a = torch.empty(16, 16, dtype=dtype)
    c = torch.empty(16, 16, dtype=torch.float32)
    name = f"mm-{str(dtype).split('.')[-1]}-{BM}x{BN}x{BK}-w{num_warps}-s{num_stages}"
    return KernelLaunch(name, _mm_kernel, (a, a, c, M, N, K, K, 1, N, 1, N, 1),
                        dict(BM=BM, BN=BN, BK=BK, num_warps=num_warps, num_stages=num_stages))


def test_bf16_pipelining_reproduced_sm80():
    """bf16 64x64x64: with the JIT's alignment specialization, num_stages=3 pipelines (more shared memory than
    num_stages=1). Without the specialization both would be 16 KiB: this catches a lost binder."""
    r1 = compile_launch(_mm_launch(torch.bfloat16, 64, 64, 64, num_stages=1), 80)
    r3 = compile_launch(_mm_launch(torch.bfloat16, 64, 64, 64, num_stages=3), 80, spills=True)
    assert r1.shared > 0
    assert r3.shared > r1.shared, (r1, r3)
    assert r3.n_regs is not None and 0 < r3.n_regs < 255, r3  # 255 = unspecialized / broken
    assert r3.n_spills == 0, r3
    assert fits(r3)


def test_oversize_config_detected_sm120():
    """fp32 128x128x64 with 3 stages needs ~128 KiB: must be reported as not fitting 101,376 B on sm_120."""
    r = compile_launch(_mm_launch(torch.float32, 128, 128, 64, num_stages=3, num_warps=8), 120)
    assert OPTIN_SMEM[120] == 101_376
    assert r.total_shared > OPTIN_SMEM[120], r
    assert not fits(r)


def test_unknown_arch_refused():
    with pytest.raises(ValueError, match="unknown architecture"):
        compile_launch(_mm_launch(torch.float32, 32, 32, 32, num_stages=1), 122)


def test_arch_parsing():
    assert parse_arch("sm_89") == 89 and parse_arch("89") == 89 and parse_arch("sm_90a") == 90
    assert parse_arch("12.0") == 120 and parse_arch(100) == 100
    assert arch_spec("sm_120").smem_optin == 101_376
    with pytest.raises(ValueError, match="known"):
        arch_spec("sm_75")
