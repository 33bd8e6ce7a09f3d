"""What Triton's interpreter (``TRITON_INTERPRET=1``) lacks for our kernels.

- ``libdevice``: the interpreter cannot call CUDA's math library, so each function the
  kernels use is evaluated with torch on the host arrays.
- ``range(0, rnumel, RBLOCK)`` over a runtime size: the interpreter converts the size with
  ``int()`` of a one-element array, which NumPy 2 refuses; it is converted with ``.item()``.
"""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter as _interpreter
from triton.runtime.interpreter import TensorHandle

_UNARY = {
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log,
    "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv,
    "lgamma": torch.lgamma, "trunc": torch.trunc, "nearbyint": torch.round,
    "floor": torch.floor, "ceil": torch.ceil, "cyl_bessel_i0": torch.special.i0,
    "cyl_bessel_i1": torch.special.i1, "erfcx": torch.special.erfcx,
    "normcdfinv": torch.special.ndtri,
}  # fmt: skip
_BINARY = {
    "pow": torch.pow, "atan2": torch.atan2, "hypot": torch.hypot, "fmod": torch.fmod,
    "copysign": torch.copysign, "nextafter": torch.nextafter,
}  # fmt: skip


def _wrap(fn):
    def call(*args):
        first = next(a for a in args if isinstance(a, tl.tensor))
        arrays = [
            torch.from_numpy(np.asarray(a.handle.data)) if isinstance(a, tl.tensor) else a
            for a in args
        ]
        out = np.asarray(fn(*arrays).numpy().astype(first.handle.data.dtype))
        scalar = first.handle.dtype.scalar
        ty = tl.block_type(scalar, list(out.shape)) if out.shape else scalar
        return tl.tensor(TensorHandle(out, scalar), ty)

    return call


class _Libdevice:
    def __getattr__(self, name: str):
        if name in _UNARY:
            return _wrap(_UNARY[name])
        if name in _BINARY:
            return _wrap(_BINARY[name])
        raise AttributeError(f"no interpreter version of libdevice.{name}")


libdevice = _Libdevice()


_patch_lang_tensor = _interpreter._patch_lang_tensor


def _patch_index(tensor, scope) -> None:
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).item()))


_interpreter._patch_lang_tensor = _patch_index
