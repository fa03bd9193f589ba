"""GPU lane: one illegal memory access makes the process's CUDA context unusable, and every later test in the
same process would fail with the same error, hiding which test caused it. After each test we synchronize; if the
context is gone, the process ends (under pytest-xdist the worker is replaced, so the remaining tests still run
in a fresh context; without xdist the session stops). A kernel fault surfaces at the test's own next
synchronisation at the latest (here), so it is charged to the test that launched it; CUDA_LAUNCH_BLOCKING=1 also
names the faulting launch in the traceback."""
import os
import sys

import pytest
import torch


@pytest.fixture(autouse=True)
def _cuda_context_guard(request):
    yield
    if not torch.cuda.is_available():
        return
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 — any error here means the context is lost
        msg = f"CUDA context lost during {request.node.nodeid}: {type(e).__name__}: {e}"
        if os.environ.get("PYTEST_XDIST_WORKER"):
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()
            os._exit(70)
        pytest.exit(msg, returncode=70)
