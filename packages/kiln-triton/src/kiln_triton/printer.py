"""Sympy index and size expressions printed as Triton code.

Index variables and sizes are non-negative, so ``FloorDiv``/``ModularIndexing`` of them
print as Triton's ``//`` and ``%``; an operand sympy cannot prove non-negative (an
indirect index is wrapped before use, a size expression may be anything) goes through the
flooring helpers of :mod:`kiln_triton.device`. Float size expressions (``ToFloat``,
``IntTrueDiv``, ``FloatPow``, ``OpaqueUnaryFn_sqrt`` ...) compute in ``tl.float64``, as
Python does, with ``libdevice``'s functions, and come back to ``tl.int64`` through its
``floor``/``ceil``/``trunc``/``nearbyint`` (half to even, as Python's ``round``).
"""

from __future__ import annotations

import sympy

from kiln_loopir.index_printer import ParenthesizedIndexPrinter, is_float_valued


def _nonneg(expr: sympy.Expr) -> bool:
    return bool(sympy.sympify(expr).is_nonnegative)


class TritonIndexPrinter(ParenthesizedIndexPrinter):
    printmethod = "_kiln_triton"
    language = "Triton"
    min_function = "tl.minimum"
    max_function = "tl.maximum"
    float_min_function = "tl.minimum"
    float_max_function = "tl.maximum"

    def floordiv(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if _nonneg(a) and _nonneg(b):
            return f"({self._print(a)} // {self._print(b)})"
        return f"kt.floordiv_int({self._print(a)}, {self._print(b)})"

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        if _nonneg(a) and _nonneg(b):
            return f"({self._print(a)} % {self._print(b)})"
        return f"kt.mod_int({self._print(a)}, {self._print(b)})"

    def _tensor(self, x: sympy.Expr, dtype: str) -> str:
        """``x`` as a Triton scalar of ``dtype``: also a number, or a size Triton passed as a
        constant (it does for a 1), which have no tensor type of their own."""
        return f"(tl.zeros([], {dtype}) + {self._print(x)})"

    def to_float(self, x: sympy.Expr) -> str:
        if is_float_valued(x) and not x.is_Number:
            return self._print(x)  # a float64 already
        return self._tensor(x, "tl.float64")

    def true_div(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"({self.to_float(a)} / {self.to_float(b)})"

    def float_pow(self, base: sympy.Expr, exp: sympy.Expr) -> str:
        return f"kt.libdevice.pow({self.to_float(base)}, {self.to_float(exp)})"

    def int_pow(self, base: sympy.Expr, exp: sympy.Expr) -> str:
        return f"kt.pow_int({self._tensor(base, 'tl.int64')}, {self._tensor(exp, 'tl.int64')})"

    def to_int(self, rounding: str, x: sympy.Expr) -> str:
        function = "nearbyint" if rounding == "round" else rounding
        return f"kt.libdevice.{function}({self.to_float(x)}).to(tl.int64)"

    def trunc_to_float(self, x: sympy.Expr) -> str:
        return f"kt.libdevice.trunc({self.to_float(x)})"

    def round_decimal(self, x: sympy.Expr, digits: int) -> str:
        scale = self.float_literal(10.0**digits)
        return f"(kt.libdevice.nearbyint({self.to_float(x)} * {scale}) / {scale})"

    def math_function(self, name: str, x: sympy.Expr) -> str:
        return f"kt.libdevice.{name}({self.to_float(x)})"

    def absolute(self, x: sympy.Expr) -> str:
        return f"tl.abs({self._print(x)})"

    def conditional(self, cond: sympy.Basic, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"tl.where({self._print(cond)}, {self._print(a)}, {self._print(b)})"

    def logical(self, op: str, args) -> str:
        if op == "not":
            return f"({self._print(args[0])} == 0)"
        return "(" + f" {'&' if op == 'and' else '|'} ".join(map(self._print, args)) + ")"

    def _print_Integer(self, expr: sympy.Integer) -> str:
        return str(int(expr))


_PRINTER = TritonIndexPrinter()


def texpr(expr: sympy.Expr | int) -> str:
    """``expr`` as a Triton expression: ``tl.int64`` for an integer expression, ``tl.float64``
    for a float one."""
    return _PRINTER.doprint(sympy.sympify(expr))
