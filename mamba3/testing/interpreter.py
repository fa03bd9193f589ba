"""bf16 support for the Triton interpreter (TRITON_INTERPRET=1), for the interpreter test lane only.

The interpreter stores bfloat16 as raw uint16 numpy arrays and computes ``+ - * /``, comparisons, ``tl.dot``,
``tl.sum``, ``tl.cumsum``, ``tl.min``/``tl.max`` on those bits, truncates fp32 -> bf16 casts (the GPU rounds to
nearest even; this also hits ``x / y`` on bf16, computed in fp32) and reinterprets the bits in bf16 <-> fp64 /
integer casts: results are silently wrong (upstream: bf16 is unsupported in the interpreter). ``install()`` wraps the few builder / reduce / scan methods involved so bf16
operands are widened to fp32, computed, and rounded back to bf16 (round to nearest even), like the GPU does.

It patches private internals of ``triton.runtime.interpreter`` (verified on triton 3.6.0, 3.7.1 and 3.9.0).
``install()`` checks that the methods it wraps exist with the expected parameters and raises otherwise;
``tests/interp/test_interpreter_selftest.py`` checks the numerics, so a Triton upgrade that breaks the
patch fails CI instead of silently testing garbage. Never install this in a process that runs real GPU kernels
(it is harmless there, but pointless).
"""

from __future__ import annotations

import inspect

import numpy as np

_PATCHED_ATTR = "_mamba3_bf16_patched"

# (class name in triton.runtime.interpreter, method name, expected parameter names) we rely on.
_EXPECTED = [
    ("InterpreterBuilder", "create_dot", ("self", "a", "b", "d", "input_precision", "max_num_imprecise_acc")),
    ("InterpreterBuilder", "binary_op", ("self", "lhs", "rhs", "op")),
    ("InterpreterBuilder", "ternary_op", ("self", "lhs", "rhs", "other", "op")),
    ("InterpreterBuilder", "create_fma", ("self", "x", "y", "z")),
    ("InterpreterBuilder", "cast_impl", ("self", "src", "dst_type")),
    ("InterpreterBuilder", "create_fp_to_fp", ("self", "src", "dst_type", "rounding_mode")),
    ("ReduceOps", "sum", ("self", "input")),
    ("ReduceOps", "min_max", ("self", "input", "val_reduce_op", "idx_reduce_op")),
    ("ScanOps", "cumsum", ("self", "input")),
    ("ScanOps", "cumprod", ("self", "input")),
    ("ReduceScanOpInterface", "to_tensor", ("self", "ret", "dtype")),
]


def _interp():
    from triton.runtime import interpreter

    return interpreter


def check_internals() -> None:
    """Raise RuntimeError if the interpreter internals the patch wraps are not what it was written for."""
    I = _interp()
    problems = []
    for cls_name, meth, params in _EXPECTED:
        cls = getattr(I, cls_name, None)
        if cls is None:
            problems.append(f"missing class triton.runtime.interpreter.{cls_name}")
            continue
        fn = getattr(cls, meth, None)
        if fn is None:
            problems.append(f"missing {cls_name}.{meth}")
            continue
        fn = getattr(fn, "__wrapped__", fn)
        got = tuple(inspect.signature(fn).parameters)
        if got != params:
            problems.append(f"{cls_name}.{meth} has parameters {got}, the patch expects {params}")
    if not hasattr(I, "TensorHandle"):
        problems.append("missing triton.runtime.interpreter.TensorHandle")
    if problems:
        import triton

        raise RuntimeError(f"mamba3 bf16 interpreter patch does not match triton {triton.__version__}: "
                           + "; ".join(problems))


def installed() -> bool:
    I = _interp()
    return bool(getattr(I.InterpreterBuilder, _PATCHED_ATTR, False))


def _install_index_fix() -> None:
    """NumPy ≥ 2.3 refuses ``int()`` of a one-element 1-D array, which Triton 3.6's interpreter does in
    ``tensor.__index__`` for every runtime loop bound (``for j in range(n)``, program ids, loaded scalars):
    take the element instead. Idempotent."""
    I = _interp()
    if getattr(I, "_mamba3_index_patched", False):
        return
    orig = I._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    I._patch_lang_tensor = patched
    I._mamba3_index_patched = True


def install() -> None:
    """Install the bf16 fix and the runtime-loop-bound fix (idempotent)."""
    import triton.language as tl

    _install_index_fix()

    I = _interp()
    B, R, S = I.InterpreterBuilder, I.ReduceOps, I.ScanOps
    if getattr(B, _PATCHED_ATTR, False):
        return
    check_internals()
    bf16 = tl.bfloat16
    TensorHandle = I.TensorHandle

    def is_bf16(h) -> bool:
        return h.dtype.scalar == bf16

    def numeric(ty) -> bool:
        """Types whose numpy storage holds the values themselves (not fp8/bf16 bit patterns)."""
        return ty in (tl.float16, tl.float32, tl.float64) or ty.is_int()

    def up(h):
        """bf16 handle (uint16 bits) -> fp32 handle; other handles unchanged."""
        if is_bf16(h):
            return TensorHandle((np.asarray(h.data).astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def down(x) -> np.ndarray:
        """fp32 values -> bf16 bits (uint16), round to nearest even, NaN kept as a quiet NaN."""
        x = np.asarray(x, dtype=np.float32)
        bits = x.view(np.uint32)
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
        return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)

    o_dot, o_bin, o_tern, o_fma = B.create_dot, B.binary_op, B.ternary_op, B.create_fma
    o_cast, o_fp_to_fp = B.cast_impl, B.create_fp_to_fp
    rtz = I._ir.ROUNDING_MODE.RTZ
    o_sum, o_minmax, o_cumsum, o_cumprod = R.sum, R.min_max, S.cumsum, S.cumprod

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return o_dot(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)

    def binary_op(self, lhs, rhs, op):
        if not is_bf16(lhs):
            return o_bin(self, lhs, rhs, op)
        out = op(up(lhs).data, up(rhs).data)
        if out.dtype == np.bool_:
            return TensorHandle(out, tl.int1)
        return TensorHandle(down(out), bf16)

    def ternary_op(self, lhs, rhs, other, op):
        # np.where selects raw bits: correct as is. Others (np.clip) need values.
        if op is np.where or not is_bf16(other):
            return o_tern(self, lhs, rhs, other, op)
        return TensorHandle(down(op(up(lhs).data, up(rhs).data, up(other).data)), bf16)

    def create_fma(self, x, y, z):
        if not is_bf16(z):
            return o_fma(self, x, y, z)
        return TensorHandle(down(up(x).data * up(y).data + up(z).data), bf16)

    def cast_impl(self, src, dst_type):
        # The interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even) and reinterprets the uint16
        # bits of bf16 in casts from/to fp64 and integers.
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if dst_ty == bf16 and numeric(src_ty):
            return TensorHandle(down(np.asarray(src.data).astype(np.float32)), bf16)
        if src_ty == bf16 and dst_ty != bf16:
            return o_cast(self, up(src), dst_type)
        return o_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):  # .to(bf16, fp_downcast_rounding=...)
        if dst_type.scalar == bf16 and numeric(src.dtype.scalar) and rounding_mode != rtz:
            return TensorHandle(down(np.asarray(src.data).astype(np.float32)), bf16)
        return o_fp_to_fp(self, src, dst_type, rounding_mode)

    def reduce_sum(self, input):
        if not is_bf16(input.handle):
            return o_sum(self, input)
        total = np.sum(up(input.handle).data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(down(total), input.dtype)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):  # called with these keyword names
        x = input[0] if isinstance(input, tuple) else input
        if not is_bf16(x.handle):
            return o_minmax(self, input, val_reduce_op=val_reduce_op, idx_reduce_op=idx_reduce_op)
        out = o_minmax(self, self.to_tensor(up(x.handle).data, tl.float32), val_reduce_op=val_reduce_op,
                       idx_reduce_op=idx_reduce_op)

        def fix(t):  # values come back fp32 (exact: min/max of bf16 values), indices int32
            return self.to_tensor(down(t.handle.data), x.dtype) if t.dtype.scalar == tl.float32 else t

        return tuple(fix(t) for t in out) if isinstance(out, tuple) else fix(out)

    def scan(orig, np_fn):
        def f(self, input):
            if not is_bf16(input.handle):
                return orig(self, input)
            return [self.to_tensor(down(np_fn(up(input.handle).data, axis=self.axis)), dtype=input.dtype)]

        f.__name__ = orig.__name__
        return f

    patched = {
        (B, "create_dot"): create_dot,
        (B, "binary_op"): binary_op,
        (B, "ternary_op"): ternary_op,
        (B, "create_fma"): create_fma,
        (B, "cast_impl"): cast_impl,
        (B, "create_fp_to_fp"): create_fp_to_fp,
        (R, "sum"): reduce_sum,
        (R, "min_max"): min_max,
        (S, "cumsum"): scan(o_cumsum, np.cumsum),
        (S, "cumprod"): scan(o_cumprod, np.cumprod),
    }
    for (cls, name), fn in patched.items():
        fn._mamba3_bf16 = True
        setattr(cls, name, fn)
    setattr(B, _PATCHED_ATTR, True)


def patched_methods() -> dict[str, bool]:
    """Which wrapped methods currently carry the patch (for the self-test)."""
    I = _interp()
    out = {}
    for cls_name, meth, _ in _EXPECTED:
        if cls_name == "ReduceScanOpInterface":
            continue
        out[f"{cls_name}.{meth}"] = bool(getattr(getattr(getattr(I, cls_name), meth), "_mamba3_bf16", False))
    return out
