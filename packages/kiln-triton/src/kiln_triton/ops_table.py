"""The elementwise ops as Triton expressions, keyed by op name, per kind of dtype.

Each entry maps operand strings (already converted to one operand type) to a Triton
expression. ``float`` entries serve floating dtypes (half precision is computed in
float32), ``int`` entries integer dtypes, ``bool`` entries bool. ``result_dtype`` gives the
torch dtype of the result.
"""

from __future__ import annotations

import torch


def _lib(name: str):
    return lambda *xs: f"kt.libdevice.{name}({', '.join(xs)})"


def _kt(name: str):
    return lambda *xs: f"kt.{name}({', '.join(xs)})"


def _tl(name: str):
    return lambda *xs: f"tl.{name}({', '.join(xs)})"


def _infix(op: str):
    return lambda a, b: f"({a} {op} {b})"


FLOAT_UNARY = {
    "neg": lambda x: f"(-{x})",
    "abs": _tl("abs"),
    "exp": _tl("exp"),
    "log": _tl("log"),
    "sin": _tl("sin"),
    "cos": _tl("cos"),
    "floor": _tl("floor"),
    "ceil": _tl("ceil"),
    "sqrt": _lib("sqrt"),
    "sigmoid": _kt("sigmoid"),
    "reciprocal": lambda x: f"(1 / {x})",
    "round": _lib("nearbyint"),
    "sign": _kt("sign"),
    "signbit": lambda x: f"(kt.libdevice.copysign(1.0 + {x} * 0, {x}) < 0)",
    "logical_not": lambda x: f"({x} == 0)",
    "isnan": lambda x: f"({x} != {x})",
    "isinf": _kt("isinf"),
    "isfinite": _kt("isfinite"),
    "digamma": _kt("digamma"),
    "trigamma": _kt("trigamma"),
    "i0": _lib("cyl_bessel_i0"),
    "i1": _lib("cyl_bessel_i1"),
    "i0e": _kt("i0e"),
    "i1e": _kt("i1e"),
    "erfcx": _lib("erfcx"),
    "ndtri": _kt("ndtri"),
    **{
        n: _lib(n)
        for n in (
            "exp2", "expm1", "log2", "log10", "log1p", "rsqrt", "tan", "asin", "acos",
            "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
            "erfinv", "trunc", "lgamma",
        )
    },
}  # fmt: skip
INT_UNARY = {
    "neg": lambda x: f"(-{x})",
    "abs": _tl("abs"),
    "sign": _kt("sign"),
    "signbit": lambda x: f"({x} < 0)",
    "logical_not": lambda x: f"({x} == 0)",
    "bitwise_not": lambda x: f"(~{x})",
    "isnan": lambda x: f"({x} != {x})",
    "isinf": lambda x: f"({x} != {x})",
    "isfinite": lambda x: f"({x} == {x})",
    **{n: (lambda x: x) for n in ("floor", "ceil", "trunc", "round")},
}
BOOL_UNARY = {
    **INT_UNARY,
    "bitwise_not": lambda x: f"({x} == 0)",
    "abs": lambda x: x,
    "neg": lambda x: x,
    "sign": lambda x: x,
    "signbit": lambda x: f"({x} & 0)",
}

COMMON_BINARY = {
    "add": _infix("+"), "sub": _infix("-"), "mul": _infix("*"),
    "eq": _infix("=="), "ne": _infix("!="), "lt": _infix("<"), "le": _infix("<="),
    "gt": _infix(">"), "ge": _infix(">="),
    "logical_and": lambda a, b: f"(({a} != 0) & ({b} != 0))",
    "logical_or": lambda a, b: f"(({a} != 0) | ({b} != 0))",
    "logical_xor": lambda a, b: f"(({a} != 0) ^ ({b} != 0))",
}  # fmt: skip
FLOAT_BINARY = {
    **COMMON_BINARY,
    "truediv": _infix("/"),
    "floordiv": _kt("floordiv_float"),
    "truncdiv": lambda a, b: f"kt.libdevice.trunc({a} / {b})",
    "remainder": _kt("remainder_float"),
    "fmod": _lib("fmod"),
    "pow": _lib("pow"),
    "maximum": _kt("maximum"),
    "minimum": _kt("minimum"),
    "atan2": _lib("atan2"),
    "hypot": _lib("hypot"),
    "copysign": _lib("copysign"),
    "nextafter": _lib("nextafter"),
    "zeta": _kt("zeta"),
}
INT_BINARY = {
    **COMMON_BINARY,
    "floordiv": _kt("floordiv_int"),
    "truncdiv": _kt("truncdiv_int"),
    "remainder": _kt("mod_int"),
    "fmod": _kt("fmod_int"),
    "pow": _kt("pow_int"),
    "maximum": _tl("maximum"),
    "minimum": _tl("minimum"),
    "bitwise_and": _infix("&"),
    "bitwise_or": _infix("|"),
    "bitwise_xor": _infix("^"),
    "bitwise_left_shift": _kt("shl"),
    "bitwise_right_shift": _kt("shr"),
}
BOOL_BINARY = {
    **COMMON_BINARY,
    "add": _infix("|"),
    "mul": _infix("&"),
    "sub": _infix("^"),
    "maximum": _infix("|"),
    "minimum": _infix("&"),
    "bitwise_and": _infix("&"),
    "bitwise_or": _infix("|"),
    "bitwise_xor": _infix("^"),
}


def table(dtype: torch.dtype, arity: int) -> dict:
    if dtype.is_floating_point:
        return FLOAT_UNARY if arity == 1 else FLOAT_BINARY
    if dtype == torch.bool:
        return BOOL_UNARY if arity == 1 else BOOL_BINARY
    return INT_UNARY if arity == 1 else INT_BINARY
