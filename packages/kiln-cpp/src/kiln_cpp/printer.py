"""Sympy index and size expressions printed as C++.

Integer expressions compute over ``int64_t``; ``FloorDiv``, ``ModularIndexing`` and
``Mod`` floor (Python semantics), also for negative values: they print as calls of
``kiln::floordiv`` and ``kiln::mod`` from the prelude. Float expressions (``ToFloat``,
``IntTrueDiv``, ``FloatPow``, ``OpaqueUnaryFn_sqrt`` ...: torch's symbolic shapes make
them for ``n ** -0.5`` or ``math.ceil(n / 3)``) compute over ``double``, as Python does,
and come back to ``int64_t`` through ``std::floor``/``ceil``/``trunc``/``nearbyint``
(half to even, as Python's ``round``).
"""

from __future__ import annotations

import functools
import math

import sympy

from kiln_cpp.statements import mark
from kiln_loopir.index_printer import ParenthesizedIndexPrinter, is_float_valued


class CppIndexPrinter(ParenthesizedIndexPrinter):
    # not "_sympystr": torch's sympy functions print themselves as Python with it
    printmethod = "_kiln_cpp"
    language = "C++"
    min_function = "std::min<int64_t>"
    max_function = "std::max<int64_t>"
    float_min_function = "std::min<double>"
    float_max_function = "std::max<double>"

    def floordiv(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"kiln::floordiv<int64_t>({self._print(a)}, {self._print(b)})"

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"kiln::mod<int64_t>({self._print(a)}, {self._print(b)})"

    def to_float(self, x: sympy.Expr) -> str:
        if x.is_Number:
            return self.float_literal(float(x))
        if is_float_valued(x):
            return self._print(x)  # a double already
        return f"static_cast<double>({self._print(x)})"

    def true_div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self.to_float(a)} / {self.to_float(b)})"

    def float_pow(self, base: sympy.Expr, exp: sympy.Expr) -> str:
        return f"std::pow({self.to_float(base)}, {self.to_float(exp)})"

    def int_pow(self, base: sympy.Expr, exp: sympy.Expr) -> str:
        return f"kiln::pow_by_natural({self._print(base)}, {self._print(exp)})"

    def to_int(self, rounding: str, x: sympy.Expr) -> str:
        function = "nearbyint" if rounding == "round" else rounding
        return f"static_cast<int64_t>(std::{function}({self.to_float(x)}))"

    def trunc_to_float(self, x: sympy.Expr) -> str:
        return f"std::trunc({self.to_float(x)})"

    def round_decimal(self, x: sympy.Expr, digits: int) -> str:
        scale = self.float_literal(10.0**digits)
        return f"(std::nearbyint({self.to_float(x)} * {scale}) / {scale})"

    def math_function(self, name: str, x: sympy.Expr) -> str:
        return f"std::{name}({self.to_float(x)})"

    def absolute(self, x: sympy.Expr) -> str:
        return f"std::abs({self._print(x)})"

    def conditional(self, cond: sympy.Basic, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self._print(cond)} ? {self._print(a)} : {self._print(b)})"

    def logical(self, op: str, args) -> str:
        if op == "not":
            return f"(!{self._print(args[0])})"
        return "(" + f" {'&&' if op == 'and' else '||'} ".join(map(self._print, args)) + ")"

    def float_literal(self, value: float) -> str:
        if math.isinf(value):
            return f"({'-' if value < 0 else ''}std::numeric_limits<double>::infinity())"
        if math.isnan(value):
            return "std::numeric_limits<double>::quiet_NaN()"
        return repr(value)  # "0.5", "1e-05": C++ double literals, read back exactly

    def _print_BooleanTrue(self, expr: sympy.Basic) -> str:
        return "true"

    def _print_BooleanFalse(self, expr: sympy.Basic) -> str:
        return "false"

    def _print_Integer(self, expr: sympy.Integer) -> str:
        v = int(expr)
        if v == -(2**63):
            return "(INT64_C(-9223372036854775807) - 1)"
        return f"INT64_C({v})" if abs(v) > 2**31 - 1 else str(v)


_PRINTER = CppIndexPrinter()


class _NamingPrinter(CppIndexPrinter):
    """Prints the symbols in ``names`` marked (:func:`kiln_cpp.statements.mark`)."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__()
        self.names = names

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return mark(expr.name) if expr.name in self.names else expr.name


def cexpr_naming(expr: sympy.Expr, names: frozenset[str]) -> str:
    """``expr`` as :func:`cexpr` prints it, the symbols in ``names`` (values of the kernel
    body: indirect indices) marked as the names an expression reads."""
    if not any(s.name in names for s in sympy.sympify(expr).free_symbols):
        return cexpr(expr)
    return _NamingPrinter(names).doprint(sympy.sympify(expr))


def cexpr(expr: sympy.Expr | int) -> str:
    """``expr`` as a C++ expression: ``int64_t`` for an integer expression, ``double`` for a
    float one."""
    return _printed(sympy.sympify(expr))


@functools.lru_cache(maxsize=16384)
def _printed(expr: sympy.Basic) -> str:
    # kernels print the same index expressions many times over: sympy's printer is slow
    return _PRINTER.doprint(expr)
