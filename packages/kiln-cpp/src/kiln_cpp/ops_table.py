"""The elementwise ops as C++ expressions, keyed by op name, per kind of dtype.

Each entry maps operand strings to a C++ expression; ``float`` entries serve floating
dtypes, ``int`` entries integer dtypes and bool. The result dtype rule is
``kiln_loopir.ops.result_dtype``.
"""

from __future__ import annotations

import torch


def _std(name: str):
    return lambda x: f"std::{name}({x})"


FLOAT_UNARY = {
    "neg": lambda x: f"(-{x})",
    "abs": _std("abs"),
    "rsqrt": lambda x: f"(1 / std::sqrt({x}))",
    "sigmoid": lambda x: f"kiln::sigmoid({x})",
    "reciprocal": lambda x: f"(1 / {x})",
    "round": _std("nearbyint"),
    "sign": lambda x: f"kiln::sign({x})",
    "signbit": _std("signbit"),
    "logical_not": lambda x: f"(!{x})",
    "isnan": _std("isnan"),
    "isinf": _std("isinf"),
    "isfinite": _std("isfinite"),
    "erfinv": lambda x: f"kiln::erfinv({x})",
    "digamma": lambda x: f"kiln::digamma({x})",
    **{
        n: (lambda x, n=n: f"kiln::{n}({x})")
        for n in ("trigamma", "i0", "i0e", "i1", "i1e", "erfcx", "ndtri")
    },
    **{
        n: _std(n)
        for n in (
            "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos",
            "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
            "erf", "erfc", "floor", "ceil", "trunc", "lgamma",
        )
    },
}  # fmt: skip
INT_UNARY = {
    "neg": lambda x: f"(-{x})",
    "abs": lambda x: f"({x} < 0 ? -{x} : {x})",
    "sign": lambda x: f"kiln::sign({x})",
    "signbit": lambda x: f"({x} < 0)",
    "logical_not": lambda x: f"(!{x})",
    "bitwise_not": lambda x: f"(~{x})",
    "isnan": lambda x: "false",
    "isinf": lambda x: "false",
    "isfinite": lambda x: "true",
    **{n: (lambda x: x) for n in ("floor", "ceil", "trunc", "round")},
}
BOOL_UNARY = {**INT_UNARY, "bitwise_not": lambda x: f"(!{x})", "abs": lambda x: x}


def _infix(op: str):
    return lambda a, b: f"({a} {op} {b})"


def _call(fn: str):
    return lambda a, b: f"{fn}({a}, {b})"


COMMON_BINARY = {
    "add": _infix("+"), "sub": _infix("-"), "mul": _infix("*"),
    "eq": _infix("=="), "ne": _infix("!="), "lt": _infix("<"), "le": _infix("<="),
    "gt": _infix(">"), "ge": _infix(">="),
    "logical_and": lambda a, b: f"(static_cast<bool>({a}) && static_cast<bool>({b}))",
    "logical_or": lambda a, b: f"(static_cast<bool>({a}) || static_cast<bool>({b}))",
    "logical_xor": lambda a, b: f"(static_cast<bool>({a}) != static_cast<bool>({b}))",
}  # fmt: skip
FLOAT_BINARY = {
    **COMMON_BINARY,
    "truediv": _infix("/"),
    "floordiv": _call("kiln::floordiv_float"),
    "truncdiv": lambda a, b: f"std::trunc({a} / {b})",
    "remainder": _call("kiln::remainder_float"),
    "fmod": _call("std::fmod"),
    "pow": _call("std::pow"),
    "maximum": _call("kiln::max_float"),
    "minimum": _call("kiln::min_float"),
    "atan2": _call("std::atan2"),
    "hypot": _call("std::hypot"),
    "copysign": _call("std::copysign"),
    "nextafter": _call("std::nextafter"),
    "zeta": _call("kiln::zeta"),
}
INT_BINARY = {
    **COMMON_BINARY,
    "floordiv": _call("kiln::floordiv"),
    "truncdiv": _call("kiln::truncdiv"),
    "remainder": _call("kiln::mod"),
    "fmod": _call("kiln::fmod_int"),
    "pow": _call("kiln::pow_int"),
    "maximum": lambda a, b: f"std::max({a}, {b})",
    "minimum": lambda a, b: f"std::min({a}, {b})",
    "bitwise_and": _infix("&"),
    "bitwise_or": _infix("|"),
    "bitwise_xor": _infix("^"),
    "bitwise_left_shift": _call("kiln::shl"),
    "bitwise_right_shift": _call("kiln::shr"),
}
BOOL_BINARY = {
    **COMMON_BINARY,
    "add": _infix("||"),
    "mul": _infix("&&"),
    "maximum": _infix("||"),
    "minimum": _infix("&&"),
    "bitwise_and": _infix("&&"),
    "bitwise_or": _infix("||"),
    "bitwise_xor": _infix("!="),
}


def table(dtype: torch.dtype, arity: int) -> dict:
    if dtype.is_floating_point:
        return FLOAT_UNARY if arity == 1 else FLOAT_BINARY
    if dtype == torch.bool:
        return BOOL_UNARY if arity == 1 else BOOL_BINARY
    return INT_UNARY if arity == 1 else INT_BINARY
