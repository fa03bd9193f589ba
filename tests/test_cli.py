"""`python -m mamba3 info | check` as a user runs them (subprocesses, CPU, TRITON_INTERPRET unset).

`info --arch` compiles every kernel launch for that architecture: minutes on 2 cores from a cold Triton cache.
scripts/test.sh runs the aot lane first with the same TRITON_CACHE_DIR, so here those compiles are cache hits.
"""

import json
import os
import subprocess
import sys

import mamba3.dispatch as dispatch


def _run(*args, timeout=900):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-m", "mamba3", *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_info():
    rc, out, err = _run("info")
    assert rc == 0, err
    assert "torch" in out and "triton" in out
    assert "no CUDA device" in out or "shared memory opt-in" in out
    assert "backend for CPU tensors" in out and "backend for CUDA tensors" in out


def test_info_arch_json():
    rc, out, err = _run("info", "--arch", "sm_89", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert set(data) >= {"versions", "device", "backends", "targets"}
    (target,) = [t for t in data["targets"] if not t["current_device"]]
    assert target["arch"] == 89 and target["smem_optin"] == 101_376
    assert set(target["ops"]) == set(dispatch.OPS)
    for op, entry in target["ops"].items():
        if dispatch.op_configs(op) is None:
            assert entry["status"] == "no Triton kernels yet"
            continue
        assert entry["status"] == "ok" and entry["chosen"], entry
        for k in entry["kernels"]:  # the dispatcher must never choose a kernel that does not fit
            assert k["fits"], f"{op}: {k['name']} needs {k['total_shared']} B > {k['limit']} B on sm_89"


def test_info_brief_compiles_nothing():
    rc, out, err = _run("info", "--arch", "sm_86", "--brief", "--json", timeout=120)
    assert rc == 0, err
    (target,) = [t for t in json.loads(out)["targets"] if not t["current_device"]]
    with_kernels = [op for op in dispatch.OPS if dispatch.op_configs(op) is not None]
    assert with_kernels and all(target["ops"][op]["chosen"] for op in with_kernels)
    assert not any("kernels" in entry for entry in target["ops"].values())


def test_info_arch_text_and_bad_arch():
    rc, out, err = _run("info", "--arch", "sm_120")
    assert rc == 0, err
    assert "sm_120" in out and "101,376" in out
    rc, out, err = _run("info", "--arch", "sm_75")
    assert rc == 2 and "unknown architecture sm_75" in err


def test_check_cpu():
    rc, out, err = _run("check", "--device", "cpu", "--json")
    assert out, err
    data = json.loads(out)
    failed = [r for r in data["results"] if not r["pass"]]
    assert rc == 0 and data["passed"] and not failed, failed or err
    quantities = {(r["op"], r["quantity"]) for r in data["results"]}
    assert ("siso", "out") in quantities and ("mimo", "dmimo_out") in quantities and ("siso", "dssm state") in quantities
