"""Integer index and size expressions (sympy) printed as the source of some language.

:class:`IndexPrinter` prints what every language shares; a code generator's printer says
how its language floors a division and a remainder (``floordiv``/``mod``, Python's
semantics also for negative values) and names its binary ``min``/``max``. The host
program's Python printer is one (``kiln_loopir.symbols.py_expr``); kiln-cpp and
kiln-triton each have theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
from sympy.printing.str import StrPrinter


class IndexPrinter(StrPrinter):
    language = "Python"
    min_function = "minimum"
    max_function = "maximum"

    def floordiv(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self._print(a)} // {self._print(b)})"

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self._print(a)} % {self._print(b)})"

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
        return self._nested(self.min_function, expr.args)

    def _print_Max(self, expr: sympy.Expr) -> str:
        return self._nested(self.max_function, expr.args)

    def _nested(self, function: str, args: Sequence[sympy.Expr]) -> str:
        out = self._print(args[0])
        for a in args[1:]:
            out = f"{function}({out}, {self._print(a)})"
        return out

    def _print_Pow(self, expr: sympy.Expr, rational: bool = False) -> str:
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "(" + " * ".join([self._print(base)] * int(exp)) + ")"
        raise NotImplementedError(
            f"cannot print index expression {expr} as integer {self.language}"
        )

    def _print_Rational(self, expr: sympy.Expr) -> str:
        raise NotImplementedError(f"index expression has a fraction: {expr}")

    def _print_Relational(self, expr: sympy.Expr) -> str:
        return f"({self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)})"


class ParenthesizedIndexPrinter(IndexPrinter):
    """Every product and sum in parentheses, for languages whose precedence differs from
    sympy's printing (C++ casts, Triton's tensors)."""

    def _print_Mul(self, expr: sympy.Expr) -> str:
        return "(" + " * ".join(self._print(a) for a in expr.as_ordered_factors()) + ")"

    def _print_Add(self, expr: sympy.Expr, order=None) -> str:
        return "(" + " + ".join(self._print(a) for a in expr.as_ordered_terms()) + ")"
