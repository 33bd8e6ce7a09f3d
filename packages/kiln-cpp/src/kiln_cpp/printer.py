"""Sympy index and size expressions printed as C++ over ``int64_t``.

``FloorDiv``, ``ModularIndexing`` and ``Mod`` floor (Python semantics), also for negative
values: they print as calls of ``kiln::floordiv`` and ``kiln::mod`` from the prelude.
"""

from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter


class CppIndexPrinter(StrPrinter):
    # not "_sympystr": torch's sympy functions print themselves as Python with it
    printmethod = "_kiln_cpp"

    def _print_Integer(self, expr: sympy.Integer) -> str:
        v = int(expr)
        if v == -(2**63):
            return "(INT64_C(-9223372036854775807) - 1)"
        return f"INT64_C({v})" if abs(v) > 2**31 - 1 else str(v)

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return expr.name

    def _print_FloorDiv(self, expr: sympy.Expr) -> str:
        a, b = expr.args
        return f"kiln::floordiv<int64_t>({self._print(a)}, {self._print(b)})"

    _print_CleanDiv = _print_FloorDiv

    def _print_ModularIndexing(self, expr: sympy.Expr) -> str:
        x, div, mod = expr.args
        inner = (
            self._print(x)
            if div == 1
            else f"kiln::floordiv<int64_t>({self._print(x)}, {self._print(div)})"
        )
        return f"kiln::mod<int64_t>({inner}, {self._print(mod)})"

    def _print_Mod(self, expr: sympy.Expr) -> str:
        a, b = expr.args
        return f"kiln::mod<int64_t>({self._print(a)}, {self._print(b)})"

    _print_PythonMod = _print_Mod

    def _print_Min(self, expr: sympy.Expr) -> str:
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"std::min<int64_t>({out}, {self._print(a)})"
        return out

    def _print_Max(self, expr: sympy.Expr) -> str:
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"std::max<int64_t>({out}, {self._print(a)})"
        return out

    def _print_Pow(self, expr: sympy.Expr, rational: bool = False) -> str:
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "(" + "*".join([self._print(base)] * int(exp)) + ")"
        raise NotImplementedError(f"cannot print index expression {expr} as integer C++")

    def _print_Rational(self, expr: sympy.Expr) -> str:
        raise NotImplementedError(f"index expression has a fraction: {expr}")

    def _print_Relational(self, expr: sympy.Expr) -> str:
        return f"({self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)})"

    def _print_Mul(self, expr: sympy.Expr) -> str:
        return "(" + " * ".join(self._print(a) for a in expr.as_ordered_factors()) + ")"

    def _print_Add(self, expr: sympy.Expr, order=None) -> str:
        return "(" + " + ".join(self._print(a) for a in expr.as_ordered_terms()) + ")"


_PRINTER = CppIndexPrinter()


def cexpr(expr: sympy.Expr | int) -> str:
    """``expr`` as a C++ ``int64_t`` expression."""
    return _PRINTER.doprint(sympy.sympify(expr))
