"""Every kernel configuration the dispatcher can choose fits its architecture's opt-in shared memory.

For each CI architecture and each op whose configs module exists, compile every ``aot_launches(arch)`` entry
ahead of time (no GPU) and assert ``shared + static_shared <= OPTIN_SMEM[arch]``. Triton itself only notices an
oversize kernel at its first launch, on the user's GPU; this lane notices it in CI.
"""

import os

import pytest

from mamba3.dispatch import CI_ARCHS, OPS, OPTIN_SMEM, op_configs
from mamba3.testing.aot import compile_launch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.exit("tests/aot must run without TRITON_INTERPRET=1 (AOT compilation needs JITFunctions)", returncode=3)


def _cases():
    cases = []
    for op in OPS:
        try:
            mod = op_configs(op)
        except Exception as e:  # a broken configs module fails its own case, not the other ops' collection
            cases.append(pytest.param(op, None, e, id=f"{op}-configs-import-error"))
            continue
        if mod is None:
            continue
        for arch in CI_ARCHS:
            try:
                launches = mod.aot_launches(arch)
            except Exception as e:
                cases.append(pytest.param(op, arch, e, id=f"sm_{arch}-{op}-aot_launches-error"))
                continue
            for launch in launches:
                cases.append(pytest.param(op, arch, launch, id=f"sm_{arch}-{op}-{launch.name}"))
    if not cases:
        cases.append(pytest.param(None, None, None, id="no-configs-modules",
                                  marks=pytest.mark.skip(reason="no op has a configs module yet (no Triton kernels)")))
    return cases


@pytest.mark.parametrize("op,arch,launch", _cases())
def test_fits_optin_shared_memory(op, arch, launch):
    if isinstance(launch, Exception):
        raise AssertionError(f"{op}: could not list the kernel launches for sm_{arch}: "
                             f"{type(launch).__name__}: {launch}") from launch
    r = compile_launch(launch, arch)
    limit = OPTIN_SMEM[arch]
    assert r.total_shared <= limit, (
        f"{op} kernel {launch.name} on sm_{arch} with config {launch.meta}: needs {r.shared} B dynamic + "
        f"{r.static_shared} B static = {r.total_shared} B shared memory > opt-in limit {limit} B "
        f"(over by {r.total_shared - limit} B)")
