"""Replaying a Triton op's forward for its gradients only (the backward of the torch custom ops).

``mamba3.ops.custom_ops`` differentiates an op by running its forward again under autograd and calling
``torch.autograd.grad`` on it. The Triton ops' autograd Functions recompute everything their backward needs from
their inputs (chunk states, state passing), so the work of that second forward — the chunk states, the state
pass and the output kernel — would be thrown away. Inside :func:`gradients_only` the Functions skip it and
return uninitialised outputs of the right shapes: no gradient formula reads those values (the output and the
final ssm state leave the Functions through reshapes and returns only). Whatever a formula outside a Function
does read keeps being computed (SISO's final angle, which rotates the final k state; MIMO's angles are computed
outside its core Function).
"""
from __future__ import annotations

import contextlib
import threading

_LOCAL = threading.local()


@contextlib.contextmanager
def gradients_only():
    """Within: the Triton ops' forwards compute only what their gradients need (see the module docstring)."""
    prev = replaying_for_gradients()
    _LOCAL.on = True
    try:
        yield
    finally:
        _LOCAL.on = prev


def replaying_for_gradients() -> bool:
    return getattr(_LOCAL, "on", False)
