"""Sympy index and size expressions printed as C++ over ``int64_t``.

``FloorDiv``, ``ModularIndexing`` and ``Mod`` floor (Python semantics), also for negative
values: they print as calls of ``kiln::floordiv`` and ``kiln::mod`` from the prelude.
"""

from __future__ import annotations

import functools

import sympy

from kiln_loopir.index_printer import ParenthesizedIndexPrinter


class CppIndexPrinter(ParenthesizedIndexPrinter):
    # not "_sympystr": torch's sympy functions print themselves as Python with it
    printmethod = "_kiln_cpp"
    language = "C++"
    min_function = "std::min<int64_t>"
    max_function = "std::max<int64_t>"

    def floordiv(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"kiln::floordiv<int64_t>({self._print(a)}, {self._print(b)})"

    def mod(self, a: sympy.Expr, b: sympy.Expr) -> str:
        return f"kiln::mod<int64_t>({self._print(a)}, {self._print(b)})"

    def _print_Integer(self, expr: sympy.Integer) -> str:
        v = int(expr)
        if v == -(2**63):
            return "(INT64_C(-9223372036854775807) - 1)"
        return f"INT64_C({v})" if abs(v) > 2**31 - 1 else str(v)


_PRINTER = CppIndexPrinter()


def cexpr(expr: sympy.Expr | int) -> str:
    """``expr`` as a C++ ``int64_t`` expression."""
    return _printed(sympy.sympify(expr))


@functools.lru_cache(maxsize=16384)
def _printed(expr: sympy.Basic) -> str:
    # kernels print the same index expressions many times over: sympy's printer is slow
    return _PRINTER.doprint(expr)
