"""Python's number functions on symbolic sizes: ``int(n)``, ``float(n)``, ``math.sqrt(n)``,
``math.ceil(n / 2)``, ``round(n * 0.7)``, ``divmod(n, 2)``, ``(n * 0.7).__round__()``
become graph nodes of torch's symbolic versions, so a size that is symbolic stays so. A
function torch has no symbolic version of (``math.log(n)``, ``math.isqrt(n)``,
``float(n).is_integer()``) gets the size's value, fixed by a guard (as ``range(n)`` does):
another size captures again, where a graph break would split the graph and fix the result
all the same."""

from __future__ import annotations

import math
import operator

import torch

from kiln_capture.variables.base import Variable
from kiln_capture.variables.builtin_calls import builtin
from kiln_capture.variables.constant import ConstantVariable
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


# math.f that torch has no symbolic version of: run on the values, which guards fix
SPECIALIZING_MATH = [
    fn
    for name, fn in vars(math).items()
    if callable(fn) and not name.startswith("_") and fn not in MATH_FUNCTIONS
]


def specializing(fn):
    def handler(tx, *args, **kwargs):
        if not symbolic(*args, *kwargs.values()):
            return None
        args = [specialized(a) for a in args]
        kwargs = {k: specialized(v) for k, v in kwargs.items()}
        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            return None
        values = [a.as_constant() for a in args]
        kw_values = {k: v.as_constant() for k, v in kwargs.items()}
        return ConstantVariable(tx.run_user_code(fn, *values, **kw_values))

    return handler


def specialized(v: Variable) -> Variable:
    return v.specialized() if isinstance(v, SymNodeVariable) else v


for _fn in SPECIALIZING_MATH:
    builtin(_fn)(specializing(_fn))


# x.__round__() ... as the builtin of the same meaning, which keeps x symbolic
NUMBER_METHODS = {
    "__round__": round,
    "__floor__": math.floor,
    "__ceil__": math.ceil,
    "__trunc__": math.trunc,
    "__int__": int,
    "__float__": float,
    "__abs__": abs,
    "__neg__": operator.neg,
    "__pos__": operator.pos,
}


def call_number_method(tx, x: SymNodeVariable, name: str, args, kwargs) -> Variable:
    """``x.name(*args)`` of a symbolic number: through the graph where a builtin has the
    same meaning, else on its value (``x.is_integer()``), which a guard fixes."""
    from kiln_capture.variables.builtin_calls import BuiltinVariable

    fn = NUMBER_METHODS.get(name)
    if fn is not None:
        return BuiltinVariable(fn).call(tx, [x, *args], kwargs)
    return x.specialized().call_method(tx, name, args, kwargs)


@builtin(divmod)
def _divmod(tx, a, b):
    if not symbolic(a, b):
        return None
    return TupleVariable(
        [apply_operator(tx, operator.floordiv, [a, b]), apply_operator(tx, operator.mod, [a, b])]
    )


@builtin(round)
def _round(tx, x, ndigits=None):
    """``round(n * 0.7)`` (an int, rounded half to even) or ``round(n / 3, 1)`` (a float)."""
    if not symbolic(x) or (ndigits is not None and not ndigits.is_constant()):
        return None
    args = [x] if ndigits is None or ndigits.as_constant() is None else [x, ndigits]
    return graph_call(tx, round, args)
