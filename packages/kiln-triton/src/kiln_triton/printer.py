"""Sympy index and size expressions printed as Triton (and host Python) integer code.

Index variables and sizes are non-negative, so ``FloorDiv``/``ModularIndexing`` of them
print as Triton's ``//`` and ``%``; an operand sympy cannot prove non-negative (an
indirect index is wrapped before use, a size expression may be anything) goes through the
flooring helpers of :mod:`kiln_triton.device`.
"""

from __future__ import annotations

import sympy

from kiln_loopir.index_printer import ParenthesizedIndexPrinter


def _nonneg(expr: sympy.Expr) -> bool:
    return bool(sympy.sympify(expr).is_nonnegative)


class TritonIndexPrinter(ParenthesizedIndexPrinter):
    printmethod = "_kiln_triton"
    language = "Triton"
    min_function = "tl.minimum"
    max_function = "tl.maximum"

    def floordiv(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if _nonneg(a) and _nonneg(b):
            return f"({self._print(a)} // {self._print(b)})"
        return f"kt.floordiv_int({self._print(a)}, {self._print(b)})"

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if _nonneg(a) and _nonneg(b):
            return f"({self._print(a)} % {self._print(b)})"
        return f"kt.mod_int({self._print(a)}, {self._print(b)})"

    def _print_Integer(self, expr: sympy.Integer) -> str:
        return str(int(expr))


_PRINTER = TritonIndexPrinter()


def texpr(expr: sympy.Expr | int) -> str:
    """``expr`` as a Triton integer expression."""
    return _PRINTER.doprint(sympy.sympify(expr))
