"""Python's number functions on symbolic sizes: ``int(n)``, ``float(n)``, ``math.sqrt(n)``,
``math.ceil(n / 2)``, ``divmod(n, 2)`` become graph nodes of torch's symbolic versions, so
a size that is symbolic stays so (each would otherwise fix the size with a guard)."""

from __future__ import annotations

import math
import operator

import torch

from kiln_capture.variables.base import Variable
from kiln_capture.variables.builtin_calls import builtin
from kiln_capture.variables.containers import TupleVariable
from kiln_capture.variables.ops import apply_operator
from kiln_capture.variables.tensor import SymNodeVariable

# math.f -> what the graph calls (SymInt and SymFloat implement __ceil__, __floor__, ...)
MATH_FUNCTIONS = {
    math.sqrt: torch._sym_sqrt,
    math.sin: torch._sym_sin,
    math.cos: torch._sym_cos,
    math.tan: torch._sym_tan,
    math.asin: torch._sym_asin,
    math.acos: torch._sym_acos,
    math.atan: torch._sym_atan,
    math.sinh: torch._sym_sinh,
    math.cosh: torch._sym_cosh,
    math.tanh: torch._sym_tanh,
    math.log2: torch._sym_log2,
    math.ceil: math.ceil,
    math.floor: math.floor,
    math.trunc: math.trunc,
}


def symbolic(*args: Variable) -> bool:
    return any(isinstance(a, SymNodeVariable) for a in args)


def graph_call(tx, target, args: list[Variable]) -> Variable:
    return tx.output.call_graph("call_function", target, args, {})


def math_function(fn):
    target = MATH_FUNCTIONS[fn]

    def handler(tx, *args, **kwargs):
        if kwargs or not symbolic(*args):
            return None  # folded as any pure function of constants
        return graph_call(tx, target, list(args))

    return handler


for _fn in MATH_FUNCTIONS:
    builtin(_fn)(math_function(_fn))


def to_number(tx, cls: type, x: Variable) -> Variable:
    """``int(n)`` / ``float(n)`` of a symbolic number."""
    target = torch.sym_int if cls is int else torch.sym_float
    if x.python_type() is cls:
        return x
    return graph_call(tx, target, [x])


@builtin(divmod)
def _divmod(tx, a, b):
    if not symbolic(a, b):
        return None
    return TupleVariable(
        [apply_operator(tx, operator.floordiv, [a, b]), apply_operator(tx, operator.mod, [a, b])]
    )
