"""Triton-interpreter lane: every kernel runs on CPU tensors under TRITON_INTERPRET=1 (its own pytest process).

Triton reads TRITON_INTERPRET when ``@triton.jit`` runs, so it must be set before any kernel module is
imported. We set it here (conftest is imported before the test modules) and verify, now and after collection,
that no loaded mamba3 module holds a compiled JITFunction: a kernel module imported earlier (e.g. by a plugin)
would hold compiled kernels, which fail at launch with "0 active drivers" (or, with a GPU, silently test the GPU).
Then the bf16 interpreter patch (mamba3.testing.interpreter) is installed for the whole process.
"""

import os
import sys

import pytest

_WAS_SET = os.environ.get("TRITON_INTERPRET") == "1"
os.environ["TRITON_INTERPRET"] = "1"


def _compiled_kernels():
    """(module, name) of every @triton.jit kernel in loaded mamba3 modules that is NOT interpreted."""
    from triton.runtime.jit import JITFunction

    bad = []
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("mamba3") or mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            inner = obj
            for _ in range(4):  # autotune / heuristics wrappers
                if isinstance(inner, JITFunction) or not hasattr(inner, "fn"):
                    break
                inner = inner.fn
            if isinstance(inner, JITFunction):
                bad.append(f"{modname}.{attr}")
    return bad


def _fail_on_compiled_kernels():
    bad = _compiled_kernels()
    if bad:
        raise pytest.UsageError(
            "tests/interp: these Triton kernels were defined without TRITON_INTERPRET=1 and would try to run on a "
            f"GPU: {', '.join(sorted(bad))}. Run `TRITON_INTERPRET=1 python -m pytest tests/interp` in its own "
            "process (nothing may import mamba3 kernel modules before this conftest).")


_fail_on_compiled_kernels()  # kernel modules imported before this conftest (e.g. by a plugin)

from mamba3.testing import interpreter  # noqa: E402

interpreter.install()


def pytest_collection_finish(session):
    _fail_on_compiled_kernels()  # and every kernel the test modules imported


def pytest_report_header(config):
    import triton

    env = "set in the environment" if _WAS_SET else "set by tests/interp/conftest.py"
    return f"triton {triton.__version__} interpreter (TRITON_INTERPRET=1 {env}), bf16 patch installed"
