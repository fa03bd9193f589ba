"""One place where the host code launches Triton kernels, so that launches can be *recorded* instead of run.

``launch(kernel, grid, *args, **meta)`` runs ``kernel[grid](*args, **meta)``; inside ``with recording() as rec``
it appends ``(kernel, grid, args, meta)`` to ``rec`` and runs nothing. The AOT lane uses this to collect exactly
the launches (arguments, constexprs, warps, stages) the host code makes for a problem, by running the host code
on small CPU tensors (``configs.aot_launches``). Outputs of recorded launches are uninitialised memory.
"""
from __future__ import annotations

import contextlib

_RECORDER: list | None = None


def launch(kernel, grid, *args, **meta):
    if _RECORDER is not None:
        _RECORDER.append((kernel, grid, args, meta))
        return
    kernel[grid](*args, **meta)


@contextlib.contextmanager
def recording():
    global _RECORDER
    prev, _RECORDER = _RECORDER, []
    try:
        yield _RECORDER
    finally:
        _RECORDER = prev
