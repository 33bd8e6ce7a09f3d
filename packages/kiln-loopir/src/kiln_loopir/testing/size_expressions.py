"""Size expressions of every kind torch's symbolic shapes make, with the values to check
them at: each code generator prints them, evaluates the printed code and compares with
sympy's own evaluation (``expr.subs``), negative values included where the function takes
them (integer division and remainder floor, rounding is half to even, as in Python).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from torch.utils._sympy.functions import (
    BitwiseFn_bitwise_and,
    CeilToInt,
    FloatPow,
    FloatTrueDiv,
    FloorDiv,
    FloorToInt,
    IntTrueDiv,
    LShift,
    Max,
    Min,
    ModularIndexing,
    OpaqueUnaryFn_cos,
    OpaqueUnaryFn_log2,
    OpaqueUnaryFn_sqrt,
    PowByNatural,
    PythonMod,
    RoundDecimal,
    RoundToInt,
    RShift,
    ToFloat,
    TruncToFloat,
    TruncToInt,
    Where,
)

__all__ = ["A", "B", "SizeExpression", "SIZE_EXPRESSIONS", "expected"]

A, B = sympy.symbols("a b", integer=True)

SIGNED = ((-7, 2), (7, 2), (5, -3), (-5, -3), (9, 4), (0, 3), (-(2**40), 3))
POSITIVE = ((7, 2), (1, 3), (12, 5), (2**40, 3))
NATURAL = ((3, 0), (-3, 3), (2, 10), (7, 5))


@dataclass(frozen=True)
class SizeExpression:
    """``expr`` over the integer symbols ``a`` and ``b``, checked at each ``(a, b)`` of
    ``values``; ``tensors``: whether the Python printer's helpers take it elementwise."""

    expr: sympy.Expr
    values: tuple[tuple[int, int], ...] = SIGNED
    tensors: bool = True


SIZE_EXPRESSIONS: dict[str, SizeExpression] = {
    "floordiv": SizeExpression(FloorDiv(A, B)),
    "python_mod": SizeExpression(PythonMod(A, B)),
    "modular_indexing": SizeExpression(ModularIndexing(A, 2, B), POSITIVE),
    "ceil_of_a_quotient": SizeExpression(CeilToInt(IntTrueDiv(A, B))),
    "floor_of_a_quotient": SizeExpression(FloorToInt(IntTrueDiv(A, B))),
    "trunc_of_a_quotient": SizeExpression(TruncToInt(IntTrueDiv(A, B))),
    "round_half_to_even": SizeExpression(RoundToInt(IntTrueDiv(A, 2))),
    "round_a_float_product": SizeExpression(RoundToInt(ToFloat(A) * 0.7)),
    "round_decimal": SizeExpression(RoundDecimal(IntTrueDiv(A, 3), 2)),
    "trunc_to_float": SizeExpression(TruncToFloat(FloatTrueDiv(ToFloat(A), ToFloat(B)))),
    "attention_scale": SizeExpression(FloatPow(ToFloat(A), -0.5), POSITIVE),
    "square_root": SizeExpression(OpaqueUnaryFn_sqrt(ToFloat(A * B)), POSITIVE),
    "log2_and_cos": SizeExpression(
        OpaqueUnaryFn_log2(ToFloat(A)) + OpaqueUnaryFn_cos(ToFloat(B)), POSITIVE
    ),
    "power_by_natural": SizeExpression(PowByNatural(A, B), NATURAL),
    "float_max_min": SizeExpression(
        Max(ToFloat(A), FloatTrueDiv(ToFloat(B), 2.0)) + Min(A, B) * 1.5
    ),
    "where": SizeExpression(Where(A < B, A, B + 1), tensors=False),
    "piecewise": SizeExpression(sympy.Piecewise((A, A > B), (-B, True)), tensors=False),
    "abs": SizeExpression(sympy.Abs(A) + sympy.Abs(B)),
    "shifts_and_bits": SizeExpression(
        LShift(A, Max(B, 0)) + RShift(A, Max(B, 1)) + BitwiseFn_bitwise_and(A, B), SIGNED[:-1]
    ),
    # a shift as some torch versions evaluate LShift: a sympy power of a natural exponent
    "power_of_two": SizeExpression(A * sympy.Pow(2, Max(B, 0)), SIGNED[:-1]),
    # operands that are sums, products and negative numbers: a padding to a multiple of 8
    # (``a - (a + 1) % 8 + 9``) printed without parentheses read as ``a - a + 1 + 9``
    "mod_of_a_sum": SizeExpression(A - PythonMod(A + 1, 8) + 9),
    "floordiv_of_sums": SizeExpression(FloorDiv(A + B + 20, 2 * B + 1), POSITIVE),
    "modular_indexing_of_a_sum": SizeExpression(ModularIndexing(A + 3, 2, B + 1), POSITIVE),
    "power_of_a_sum": SizeExpression(PowByNatural(A - 1, B), NATURAL),
    "power_of_minus_one": SizeExpression(PowByNatural(-1, B), NATURAL[:1] + NATURAL[2:]),
}


def expected(expr: sympy.Expr, a: int, b: int) -> float:
    """``expr`` at ``a``, ``b`` as sympy (torch's functions evaluate numbers as Python
    does) computes it."""
    return float(expr.subs({A: a, B: b}))
