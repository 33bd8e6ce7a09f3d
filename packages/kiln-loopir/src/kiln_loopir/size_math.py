"""The functions the Python printer of size expressions calls (``kiln_loopir.symbols.py_expr``).

Each takes Python numbers, as the host program has them, or tensors, as the reference
kernels hold index variables, and computes what torch's sympy function of the same
meaning does for Python numbers: floats are doubles, ``round`` rounds half to even.
:data:`FUNCTIONS` is what a scope that evaluates printed expressions binds.
"""

from __future__ import annotations

import math

import torch


def _is_tensor(x: object) -> bool:
    return isinstance(x, torch.Tensor)


def _double(x):
    return x.to(torch.float64) if _is_tensor(x) else float(x)


def minimum(*args):
    """``Min``: of numbers, or elementwise of tensors."""
    return _fold(torch.minimum, min, args)


def maximum(*args):
    """``Max``: of numbers, or elementwise of tensors."""
    return _fold(torch.maximum, max, args)


def _fold(tensor_op, number_op, args):
    """``args`` combined left to right, by ``tensor_op`` where a tensor is involved."""
    out = args[0]
    for a in args[1:]:
        if _is_tensor(out) or _is_tensor(a):
            out = tensor_op(torch.as_tensor(out), torch.as_tensor(a))
        else:
            out = number_op(out, a)
    return out


def to_float(x):
    """``ToFloat``."""
    return _double(x)


def true_div(a, b):
    """``IntTrueDiv`` and ``FloatTrueDiv``: a double quotient (of ints, correctly rounded)."""
    if _is_tensor(a) or _is_tensor(b):
        return torch.true_divide(_double(a), _double(b))
    return a / b


def float_pow(base, exp):
    """``FloatPow``."""
    if _is_tensor(base) or _is_tensor(exp):
        return torch.pow(_double(base), _double(exp))
    return math.pow(base, exp)


def floor_to_int(x):
    """``FloorToInt``."""
    return torch.floor(_double(x)).to(torch.int64) if _is_tensor(x) else math.floor(x)


def ceil_to_int(x):
    """``CeilToInt``."""
    return torch.ceil(_double(x)).to(torch.int64) if _is_tensor(x) else math.ceil(x)


def trunc_to_int(x):
    """``TruncToInt``."""
    return torch.trunc(_double(x)).to(torch.int64) if _is_tensor(x) else math.trunc(x)


def round_to_int(x):
    """``RoundToInt``: half to even, as Python's ``round`` and ``torch.round``."""
    return torch.round(_double(x)).to(torch.int64) if _is_tensor(x) else round(x)


def trunc_to_float(x):
    """``TruncToFloat``."""
    return torch.trunc(_double(x)) if _is_tensor(x) else float(math.trunc(x))


def round_decimal(x, digits: int):
    """``RoundDecimal``."""
    return torch.round(_double(x), decimals=digits) if _is_tensor(x) else round(x, digits)


def math_fn(name: str, x):
    """``OpaqueUnaryFn_<name>``: ``math.<name>`` (sqrt, cos, log2 ...)."""
    if _is_tensor(x):
        return getattr(torch, name)(_double(x))
    return getattr(math, name)(x)


def absolute(x):
    """``Abs``."""
    return x.abs() if _is_tensor(x) else abs(x)


FUNCTIONS: dict[str, object] = {
    f.__name__: f
    for f in (
        minimum, maximum, to_float, true_div, float_pow, floor_to_int, ceil_to_int,
        trunc_to_int, round_to_int, trunc_to_float, round_decimal, math_fn, absolute,
    )
}  # fmt: skip
