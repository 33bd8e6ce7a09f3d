"""Index and size expressions (sympy) printed as the source of some language.

Sizes from torch's symbolic shapes are more than polynomials: ``x.shape[-1] ** -0.5``
is ``FloatPow(ToFloat(s0), -0.5)``, ``math.ceil(n / 3)`` is ``CeilToInt(IntTrueDiv(s0,
3))``. :class:`IndexPrinter` prints every kind torch's ShapeEnv makes (see
``torch.utils._sympy.functions``) through a few hooks a language overrides: how it floors
an integer division and a remainder (``floordiv``/``mod``, Python's semantics also for
negative values), names its ``min``/``max``, converts to a float, divides and raises to a
power in floats, rounds a float to an integer and calls a float math function. An
expression of any other kind is refused with its name, never printed as a call that does
not exist.

The host program's Python printer is the base itself (``kiln_loopir.symbols.py_expr``,
its helpers in :mod:`kiln_loopir.size_math`); kiln-cpp and kiln-triton each have theirs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import sympy
from sympy.printing.str import StrPrinter

# the float math functions of torch's OpaqueUnaryFn_<name> (sqrt, cos, log2 ...)
OPAQUE_PREFIX = "OpaqueUnaryFn_"

# float -> int conversions: torch's (and sympy's) function -> the rounding it does
ROUNDINGS = {
    "FloorToInt": "floor",
    "CeilToInt": "ceil",
    "TruncToInt": "trunc",
    "RoundToInt": "round",
    "floor": "floor",
    "ceiling": "ceil",
}

BITWISE_OPERATORS = {
    "BitwiseFn_bitwise_and": "&",
    "BitwiseFn_bitwise_or": "|",
    "BitwiseFn_bitwise_xor": "^",
    "LShift": "<<",
    "RShift": ">>",
}

# torch's sympy functions whose value is a float
FLOAT_FUNCTIONS = {
    "ToFloat", "IntTrueDiv", "FloatTrueDiv", "FloatPow", "TruncToFloat", "RoundDecimal",
}  # fmt: skip


def is_float_valued(expr: sympy.Basic) -> bool:
    """Whether ``expr`` computes a float: a float number, a float function of torch's, or
    a sum, product, min or max with a float term (which languages promote)."""
    name = type(expr).__name__
    if expr.is_Float or name in FLOAT_FUNCTIONS or name.startswith(OPAQUE_PREFIX):
        return True
    if expr.is_Add or expr.is_Mul or name in ("Min", "Max"):
        return any(is_float_valued(a) for a in expr.args)
    return False


class IndexPrinter(StrPrinter):
    language = "Python"
    min_function = "minimum"
    max_function = "maximum"
    float_min_function = "minimum"
    float_max_function = "maximum"

    # -- the hooks a language overrides ---------------------------------------------------
    def floordiv(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self.operand(a)} // {self.operand(b)})"

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self.operand(a)} % {self.operand(b)})"

    def to_float(self, x: sympy.Expr) -> str:
        return f"to_float({self._print(x)})"

    def true_div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"true_div({self._print(a)}, {self._print(b)})"

    def float_pow(self, base: sympy.Expr, exp: sympy.Expr) -> str:
        return f"float_pow({self._print(base)}, {self._print(exp)})"

    def int_pow(self, base: sympy.Expr, exp: sympy.Expr) -> str:
        """``base ** exp`` of integers, ``exp`` a natural number that is not a literal."""
        return f"({self.operand(base)} ** {self.operand(exp)})"

    def to_int(self, rounding: str, x: sympy.Expr) -> str:
        """``x`` rounded to an integer: ``rounding`` is floor, ceil, trunc or round (half to
        even, as Python's ``round``)."""
        return f"{rounding}_to_int({self._print(x)})"

    def trunc_to_float(self, x: sympy.Expr) -> str:
        return f"trunc_to_float({self._print(x)})"

    def round_decimal(self, x: sympy.Expr, digits: int) -> str:
        return f"round_decimal({self._print(x)}, {digits})"

    def math_function(self, name: str, x: sympy.Expr) -> str:
        """``name`` (a function of Python's math module: sqrt, cos, log2 ...) of ``x``."""
        return f"math_fn({name!r}, {self._print(x)})"

    def absolute(self, x: sympy.Expr) -> str:
        return f"absolute({self._print(x)})"

    def conditional(self, cond: sympy.Basic, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self._print(a)} if {self._print(cond)} else {self._print(b)})"

    def logical(self, op: str, args: Sequence[sympy.Basic]) -> str:
        """``op`` is "and", "or" or "not"."""
        if op == "not":
            return f"(not {self._print(args[0])})"
        return "(" + f" {op} ".join(self._print(a) for a in args) + ")"

    def float_literal(self, value: float) -> str:
        if not math.isfinite(value):
            raise NotImplementedError(f"cannot print the float {value} as {self.language}")
        return repr(value)  # the shortest text that reads back as the same double

    # -- what every language shares ---------------------------------------------------------
    def operand(self, x: sympy.Expr) -> str:
        """``x`` printed as an operand of a binary operator: in parentheses unless it is a
        symbol or a number that is not negative (``(a + 1) % 8``, not ``a + 1 % 8``)."""
        text = self._print(x)
        if isinstance(x, sympy.Symbol) or (x.is_Number and x >= 0):
            return text
        return f"({text})"

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return expr.name

    def _print_FloorDiv(self, expr: sympy.Expr) -> str:
        return self.floordiv(*expr.args)

    _print_CleanDiv = _print_FloorDiv

    def _print_ModularIndexing(self, expr: sympy.Expr) -> str:
        x, div, mod = expr.args
        if div == 1:
            return self.mod(x, mod)
        # the quotient as a symbol named by its own text, so ``mod`` prints it as it is
        return self.mod(sympy.Symbol(self.floordiv(x, div), nonnegative=True), mod)

    def _print_Mod(self, expr: sympy.Expr) -> str:
        return self.mod(*expr.args)

    _print_PythonMod = _print_Mod

    def _print_Min(self, expr: sympy.Expr) -> str:
        floats = is_float_valued(expr)
        return self._nested(self.float_min_function if floats else self.min_function, expr)

    def _print_Max(self, expr: sympy.Expr) -> str:
        floats = is_float_valued(expr)
        return self._nested(self.float_max_function if floats else self.max_function, expr)

    def _nested(self, function: str, expr: sympy.Expr) -> str:
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"{function}({out}, {self._print(a)})"
        return out

    def _print_Pow(self, expr: sympy.Expr, rational: bool = False) -> str:
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "(" + " * ".join([self._print(base)] * int(exp)) + ")"
        if base.is_integer and exp.is_integer and exp.is_nonnegative:
            return self.int_pow(base, exp)  # 2**Max(0, s1): how torch 2.11 writes a shift
        # torch writes a float power as FloatPow: a sympy Pow of another exponent is a
        # quotient sympy made, which no integer size is
        raise NotImplementedError(
            f"cannot print the power {expr} as {self.language}: only natural exponents "
            "(FloatPow for others)"
        )

    def _print_PowByNatural(self, expr: sympy.Expr) -> str:
        base, exp = expr.args
        if exp.is_Integer:
            return self._print(sympy.Pow(base, exp, evaluate=False)) if exp > 0 else "1"
        return self.int_pow(base, exp)

    def _print_FloatPow(self, expr: sympy.Expr) -> str:
        return self.float_pow(*expr.args)

    def _print_IntTrueDiv(self, expr: sympy.Expr) -> str:
        return self.true_div(*expr.args)

    _print_FloatTrueDiv = _print_IntTrueDiv

    def _print_ToFloat(self, expr: sympy.Expr) -> str:
        return self.to_float(expr.args[0])

    def _print_TruncToFloat(self, expr: sympy.Expr) -> str:
        return self.trunc_to_float(expr.args[0])

    def _print_RoundDecimal(self, expr: sympy.Expr) -> str:
        x, digits = expr.args
        if not digits.is_Integer:
            raise NotImplementedError(f"cannot print {expr}: its digits are not a number")
        return self.round_decimal(x, int(digits))

    def _print_Identity(self, expr: sympy.Expr) -> str:
        return self._print(expr.args[0])

    def _print_Abs(self, expr: sympy.Expr) -> str:
        return self.absolute(expr.args[0])

    def _print_Where(self, expr: sympy.Expr) -> str:
        return self.conditional(*expr.args)

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        """Nested conditionals, last case first: the tracer writes slice bounds a read
        number gives (``narrow(0, n.item(), 2)``) this way."""
        *cases, (out_value, out_cond) = expr.args
        if out_cond != sympy.true:
            raise NotImplementedError(f"cannot print {expr}: no case applies otherwise")
        out = self._print(out_value)
        for value, cond in reversed(cases):
            # the printed rest as a symbol named by its own text, so it prints as it is
            out = self.conditional(cond, value, sympy.Symbol(out))
        return out

    def _print_And(self, expr: sympy.Basic) -> str:
        return self.logical("and", expr.args)

    def _print_Or(self, expr: sympy.Basic) -> str:
        return self.logical("or", expr.args)

    def _print_Not(self, expr: sympy.Basic) -> str:
        return self.logical("not", expr.args)

    def _print_BooleanTrue(self, expr: sympy.Basic) -> str:
        return "True"

    def _print_BooleanFalse(self, expr: sympy.Basic) -> str:
        return "False"

    def _print_Float(self, expr: sympy.Float) -> str:
        return self.float_literal(float(expr))

    def _print_Rational(self, expr: sympy.Expr) -> str:
        raise NotImplementedError(f"index expression has a fraction: {expr}")

    def _print_Relational(self, expr: sympy.Expr) -> str:
        return f"({self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)})"

    def _print_Function(self, expr: sympy.Expr) -> str:
        name = type(expr).__name__
        if name in ROUNDINGS:
            return self.to_int(ROUNDINGS[name], expr.args[0])
        if name.startswith(OPAQUE_PREFIX):
            return self.math_function(name.removeprefix(OPAQUE_PREFIX), expr.args[0])
        if name in BITWISE_OPERATORS:
            a, b = (self.operand(a) for a in expr.args)
            return f"({a} {BITWISE_OPERATORS[name]} {b})"
        raise NotImplementedError(
            f"cannot print the size expression {expr} as {self.language}: {name} is not a "
            "function kiln prints; please report it"
        )

    def _print_Infinity(self, expr: sympy.Basic) -> str:
        raise NotImplementedError(f"cannot print the unbounded size {expr} as {self.language}")

    _print_NegativeInfinity = _print_NaN = _print_ComplexInfinity = _print_Infinity
    _print_IntInfinity = _print_NegativeIntInfinity = _print_Infinity


class ParenthesizedIndexPrinter(IndexPrinter):
    """Every product and sum in parentheses, for languages whose precedence differs from
    sympy's printing (C++ casts, Triton's tensors)."""

    def _print_Mul(self, expr: sympy.Expr) -> str:
        return "(" + " * ".join(self._print(a) for a in _ordered_factors(expr)) + ")"

    def _print_Add(self, expr: sympy.Expr, order=None) -> str:
        return "(" + " + ".join(self._print(a) for a in _ordered_terms(expr)) + ")"


# sympy orders a sum's terms for printing by evaluating their coefficients (about 0.2 ms a
# sum); a model's repeated layers print the same index expressions again and again
@functools.lru_cache(maxsize=16384)
def _ordered_terms(expr: sympy.Expr) -> tuple[sympy.Expr, ...]:
    return tuple(expr.as_ordered_terms())


@functools.lru_cache(maxsize=16384)
def _ordered_factors(expr: sympy.Expr) -> tuple[sympy.Expr, ...]:
    return tuple(expr.as_ordered_factors())
