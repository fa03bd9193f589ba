"""MIMO Mamba-3 on Triton kernels.

- ``api.py``: the public ``mamba3_mimo`` (validation, backend choice);
- ``function.py``: ``mimo_triton`` — per-token preparation in PyTorch, the kernels behind one autograd Function;
- ``angles.py``: θ cumsum kernels; ``fwd.py`` / ``bwd.py``: the chunk-parallel kernels; ``tiles.py``: helpers;
- ``launch.py``: chunk tables and host launchers; ``configs.py``: tile configurations, the dispatcher's choice,
  the AOT launch list; ``check.py``: kernel-vs-reference comparison used by the tests.

Kernel modules are not imported here (the interpreter lane must set TRITON_INTERPRET=1 before they load).
"""
