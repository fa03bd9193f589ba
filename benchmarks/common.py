"""Shared pieces of the benchmark scripts: the machine's ceilings measured in the same run, machine and
version info, timing, and writing results as JSON + a markdown table.

Usage from a benchmark script (run from the repository root):
    from benchmarks.common import ceilings, machine_info, bench_ms, kernel_breakdown, write_results
"""
from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch


def bench_ms(fn, warmup=25, rep=100) -> float:
    """Median time of fn() in milliseconds (triton.testing.do_bench)."""
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def kernel_breakdown(fn, leaves):
    """Per-kernel CUDA time (ms) of one call of fn, from torch.profiler (the 25 largest); clears the leaves' grads
    before the profiled call (as the timed calls do: otherwise autograd's accumulation into the warm-up call's
    grads shows up as elementwise kernels) and after it."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    for x in leaves:
        x.grad = None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    for x in leaves:
        x.grad = None
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            out[e.key[:60]] = round(t / 1e3, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:25])


def ceilings(device="cuda") -> dict:
    """Device-to-device copy bandwidth (bytes read + written per second) and bf16 matmul TFLOP/s, measured now."""
    n = 1 << 30                                                  # 1 GiB source: far larger than L2
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    mm_ms = bench_ms(lambda: a @ b)
    del src, dst, a, b
    return {"copy_TBps": 2 * n / copy_ms / 1e9, "bf16_matmul_TFLOPs": 2 * 8192 ** 3 / mm_ms / 1e9}


def machine_info() -> dict:
    import triton
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, arch=f"sm_{p.major}{p.minor}", sms=p.multi_processor_count,
                    smem_optin=p.shared_memory_per_block_optin)
    return info


def write_results(path, title: str, rows: list[dict], extra: dict | None = None) -> None:
    """rows: flat dicts with the same keys. Writes path (JSON) and path with .md (a table)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"title": title, "machine": machine_info(), **(extra or {}), "rows": rows}
    path.write_text(json.dumps(payload, indent=2))
    keys = list(rows[0]) if rows else []
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = [f"# {title}", "", " · ".join(f"{k}: {v}" for k, v in payload["machine"].items()), ""]
    if extra:
        lines += [" · ".join(f"{k}: {fmt(v) if not isinstance(v, dict) else json.dumps(v)}" for k, v in extra.items()), ""]
    lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
