"""Sympy indexing: index variables, size expressions, strided offsets, printing.

Every size, stride and index in the IR is a sympy expression over three kinds of symbols:
size symbols (``s0``, ``s1`` ..., from symbolic shapes), iteration variables (``x0`` ...
for the pointwise ranges of a node or kernel, ``r0`` ... for its reduction ranges) and
indirect-index symbols (``tmp3``: a value loaded at run time and used as an index).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Sequence

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from kiln_loopir import size_math
from kiln_loopir.index_printer import IndexPrinter
from kiln_loopir.size_math import maximum, minimum  # noqa: F401 - printed as these names

__all__ = [
    "FloorDiv",
    "ModularIndexing",
    "index_vars",
    "reduction_vars",
    "to_expr",
    "strided_index",
    "contiguous_strides",
    "py_expr",
    "evaluate",
    "is_one",
    "keeps_sizes_symbolic",
]


def index_vars(n: int, prefix: str = "x") -> list[sympy.Symbol]:
    """``n`` iteration variables ``x0 .. x{n-1}`` (non-negative integers)."""
    return [sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(n)]


def reduction_vars(n: int) -> list[sympy.Symbol]:
    """``n`` reduction variables ``r0 .. r{n-1}``."""
    return index_vars(n, "r")


def to_expr(value: object) -> sympy.Expr:
    """A size, stride or offset (int, SymInt or sympy expression) as a sympy expression."""
    if isinstance(value, sympy.Expr):
        return value
    if isinstance(value, torch.SymInt):
        return value.node.expr
    if isinstance(value, bool):
        return sympy.Integer(int(value))
    if isinstance(value, int):
        return sympy.Integer(value)
    raise TypeError(f"expected an integer size, got {value!r} ({type(value).__name__})")


def is_data_dependent(expr: object) -> bool:
    """Whether ``expr`` is a symbol whose value comes from tensor data (``u0``: an
    ``.item()``, or a size an op decides at run time), not from the inputs' sizes."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    return isinstance(expr, sympy.Symbol) and symbol_is_type(
        expr, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)
    )


def data_dependent_symbols(exprs: Iterable[object]) -> set[sympy.Symbol]:
    """The data-dependent symbols (see :func:`is_data_dependent`) in ``exprs``."""
    found: set[sympy.Symbol] = set()
    for e in exprs:
        if isinstance(e, sympy.Basic):  # (a Python int holds no symbol)
            found |= {s for s in e.free_symbols if is_data_dependent(s)}
    return found


def _input_symbols(values: Iterable[object]) -> tuple[object, set[sympy.Symbol]]:
    """The ShapeEnv of fake ``values`` and the size symbols of their layouts."""
    shape_env, found = None, set()
    for v in values:
        if isinstance(v, torch.Tensor):
            exprs = [*v.shape, *v.stride(), v.storage_offset()]
            shape_env = shape_env or getattr(getattr(v, "fake_mode", None), "shape_env", None)
        elif isinstance(v, torch.SymInt):
            exprs = [v]
            shape_env = shape_env or v.node.shape_env
        else:
            continue
        for e in exprs:
            if isinstance(e, torch.SymInt):
                found |= e.node.expr.free_symbols
    return shape_env, found


@contextlib.contextmanager
def keeps_sizes_symbolic(example_inputs: Sequence[object]) -> Iterator[None]:
    """Fail the compile if, inside, a size symbol of the inputs is fixed to a number.

    Lowering reads sizes from fake tensors: asking a SymInt for a Python value (``int()``,
    ``if``, ``==``) fixes its symbol in the ShapeEnv, the kernels after it would take that
    size while the input checks take any, and a guard that pins a tensor's size to a number
    may never reach the caller's guards. A graph that needed one is refused (it runs
    eagerly, with the message) instead of computing wrong results at other sizes.
    """
    shape_env, symbols = _input_symbols(example_inputs)
    before = dict(shape_env.replacements) if shape_env is not None else {}
    yield
    if shape_env is None:
        return
    fixed = {
        s: r
        for s in symbols
        if (r := shape_env.replacements.get(s)) is not None
        and r != before.get(s)
        and sympy.sympify(r).is_number
    }
    if fixed:
        names = ", ".join(f"{s} = {fixed[s]}" for s in sorted(fixed, key=str))
        raise NotImplementedError(
            f"compiling the graph fixed symbolic sizes to numbers ({names}): the kernels "
            "would be wrong at other sizes; mark these dimensions static (dynamic=False), "
            "and please report it"
        )


def is_one(expr: sympy.Expr) -> bool:
    return expr == 1


def strided_index(
    index: Sequence[sympy.Expr], stride: Sequence[sympy.Expr], offset: sympy.Expr = sympy.S.Zero
) -> sympy.Expr:
    """The storage offset of element ``index`` of a strided layout."""
    assert len(index) == len(stride), (index, stride)
    return _strided_index(tuple(index), tuple(stride), offset)


@functools.lru_cache(maxsize=65536)
def _strided_index(index: tuple, stride: tuple, offset: sympy.Expr) -> sympy.Expr:
    # every trace of a node (verification, each fusion it takes part in, rendering) asks
    # for the same offsets again, and sympy's expand is slow
    return sympy.expand(offset + sum((i * s for i, s in zip(index, stride, strict=True)), 0))


def contiguous_strides(size: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    """Row-major strides of ``size``."""
    strides: list[sympy.Expr] = []
    running: sympy.Expr = sympy.S.One
    for s in reversed(size):
        strides.append(running)
        running = running * s
    return tuple(reversed(strides))


class _PythonPrinter(IndexPrinter):
    """Prints index and size expressions as Python that works on ints and int tensors."""

    printmethod = "_sympystr"

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        """``(a if c else b)``: the tracer writes slice bounds a read number gives
        (``narrow(0, n.item(), 2)``) this way."""
        out = "None"
        for value, cond in reversed(expr.args):
            printed = self._print(value)
            out = (
                printed if cond == sympy.true else f"({printed} if {self._print(cond)} else {out})"
            )
        return out


_PRINTER = _PythonPrinter()


def py_expr(expr: sympy.Expr | int) -> str:
    """``expr`` as Python source; ``//`` and ``%`` floor, as sympy's FloorDiv/Mod do, and
    the functions it calls are those of :data:`kiln_loopir.size_math.FUNCTIONS`."""
    return _printed(sympy.sympify(expr))


@functools.lru_cache(maxsize=16384)
def _printed(expr: sympy.Basic) -> str:
    # kernels print the same index expressions many times over: sympy's printer is slow
    return _PRINTER.doprint(expr)


def evaluate(expr: sympy.Expr, env: dict[str, object]) -> object:
    """Evaluate ``expr`` with symbols bound by name in ``env`` (numbers or tensors)."""
    scope = {**size_math.FUNCTIONS, **env}
    return eval(py_expr(expr), {"__builtins__": {}}, scope)  # noqa: S307 - our own printer


def free_names(exprs: Iterable[sympy.Expr]) -> set[str]:
    names: set[str] = set()
    for e in exprs:
        names |= {s.name for s in sympy.sympify(e).free_symbols}
    return names
