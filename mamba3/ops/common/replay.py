"""Replaying a Triton op's forward for its gradients only (the backward of the MIMO torch custom op).

``mamba3.ops.custom_ops`` differentiates MIMO by running its forward again under autograd and calling
``torch.autograd.grad`` on it (SISO's custom op calls its Triton backward directly instead). The Triton op's
autograd Function recomputes everything its backward needs from its inputs (chunk states, state passing), so the
work of that second forward — the chunk states, the state pass and the output kernel — would be thrown away. Inside
:func:`gradients_only` the Function skips it and returns uninitialised outputs of the right shapes: no gradient
formula reads those values (the output and the final ssm state leave the Function through reshapes and returns
only). Whatever a formula outside the Function reads keeps being computed (MIMO's angles are computed outside its
core Function).
"""
from __future__ import annotations

import contextlib
import threading

_LOCAL = threading.local()


@contextlib.contextmanager
def gradients_only():
    """Within: the Triton MIMO forward computes only what its gradients need (see the module docstring)."""
    prev = replaying_for_gradients()
    _LOCAL.on = True
    try:
        yield
    finally:
        _LOCAL.on = prev


def replaying_for_gradients() -> bool:
    return getattr(_LOCAL, "on", False)
