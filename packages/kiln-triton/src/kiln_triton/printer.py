"""Sympy index and size expressions printed as Triton (and host Python) integer code.

Index variables and sizes are non-negative, so ``FloorDiv``/``ModularIndexing`` of them
print as Triton's ``//`` and ``%``; an operand sympy cannot prove non-negative (an
indirect index is wrapped before use, a size expression may be anything) goes through the
flooring helpers of :mod:`kiln_triton.device`.
"""

from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter


def _nonneg(expr: sympy.Expr) -> bool:
    return bool(sympy.sympify(expr).is_nonnegative)


class TritonIndexPrinter(StrPrinter):
    printmethod = "_kiln_triton"

    def _print_Integer(self, expr: sympy.Integer) -> str:
        return str(int(expr))

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return expr.name

    def _floordiv(self, a, b) -> str:
        if _nonneg(a) and _nonneg(b):
            return f"({self._print(a)} // {self._print(b)})"
        return f"kt.floordiv_int({self._print(a)}, {self._print(b)})"

    def _mod(self, a, b) -> str:
        if _nonneg(a) and _nonneg(b):
            return f"({self._print(a)} % {self._print(b)})"
        return f"kt.mod_int({self._print(a)}, {self._print(b)})"

    def _print_FloorDiv(self, expr: sympy.Expr) -> str:
        return self._floordiv(*expr.args)

    _print_CleanDiv = _print_FloorDiv

    def _print_ModularIndexing(self, expr: sympy.Expr) -> str:
        x, div, mod = expr.args
        if div == 1:
            return self._mod(x, mod)
        return self._mod(sympy.Symbol(f"({self._floordiv(x, div)})", nonnegative=True), mod)

    def _print_Mod(self, expr: sympy.Expr) -> str:
        return self._mod(*expr.args)

    _print_PythonMod = _print_Mod

    def _print_Min(self, expr: sympy.Expr) -> str:
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"tl.minimum({out}, {self._print(a)})"
        return out

    def _print_Max(self, expr: sympy.Expr) -> str:
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"tl.maximum({out}, {self._print(a)})"
        return out

    def _print_Pow(self, expr: sympy.Expr, rational: bool = False) -> str:
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "(" + " * ".join([self._print(base)] * int(exp)) + ")"
        raise NotImplementedError(f"cannot print index expression {expr} as integer Triton")

    def _print_Rational(self, expr: sympy.Expr) -> str:
        raise NotImplementedError(f"index expression has a fraction: {expr}")

    def _print_Relational(self, expr: sympy.Expr) -> str:
        return f"({self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)})"

    def _print_Mul(self, expr: sympy.Expr) -> str:
        return "(" + " * ".join(self._print(a) for a in expr.as_ordered_factors()) + ")"

    def _print_Add(self, expr: sympy.Expr, order=None) -> str:
        return "(" + " + ".join(self._print(a) for a in expr.as_ordered_terms()) + ")"


_PRINTER = TritonIndexPrinter()


def texpr(expr: sympy.Expr | int) -> str:
    """``expr`` as a Triton integer expression."""
    return _PRINTER.doprint(sympy.sympify(expr))
