"""The ``ops`` handler protocol of define-by-run inner functions, and the tracing handler.

An IR node's ``inner_fn(ops, index)`` computes one element: it calls methods of the
``ops`` object it is given (``ops.load``, ``ops.add``, ``ops.where`` ...) and returns the
value. Nothing is global: whoever evaluates an inner function passes its own handler.
:class:`TraceHandler` records the calls as numbered lines (the IR printer, the verifier and
the dependency analysis use it); the reference backend renders them as Python; a C++ or
Triton backend passes a handler that emits its own language.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sympy
import torch

from kiln_loopir.symbols import py_expr

# Elementwise operations every handler provides, besides the structural ones below.
UNARY_OPS: tuple[str, ...] = (
    "neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "erf", "erfc", "erfinv", "sigmoid", "reciprocal", "floor", "ceil", "trunc",
    "round", "sign", "signbit", "logical_not", "bitwise_not", "isnan", "isinf", "isfinite",
    "lgamma", "digamma", "trigamma", "i0", "i0e", "i1", "i1e", "erfcx", "ndtri",
)  # fmt: skip
BINARY_OPS: tuple[str, ...] = (
    "add", "sub", "mul", "truediv", "floordiv", "truncdiv", "remainder", "fmod", "pow",
    "maximum", "minimum", "atan2", "hypot", "copysign", "nextafter", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "logical_and",
    "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt", "ge", "zeta",
)  # fmt: skip
# load(buffer, index, mask=None), constant(value, dtype), index_expr(expr, dtype),
# to_dtype(x, dtype), where(cond, a, b), masked(mask, body, other),
# indirect_indexing(x, size), rand(seed, offset), randn(seed, offset); and, used by a
# kernel's body rather than by inner functions: reduction(type, value, src_dtype),
# scan(type, value, src_dtype) (the running value at this step of a scan loop) and
# store(buffer, index, value, accumulate=False).
STRUCTURAL_OPS: tuple[str, ...] = (
    "load", "constant", "index_expr", "to_dtype", "where", "masked", "indirect_indexing",
    "rand", "randn", "reduction", "scan", "store",
)  # fmt: skip
ALL_OPS = UNARY_OPS + BINARY_OPS + STRUCTURAL_OPS
# the operations whose result is bool whatever their operands' dtype
BOOL_RESULT_OPS: frozenset[str] = frozenset((
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "logical_not", "isnan", "isinf", "isfinite", "signbit",
))  # fmt: skip


def result_dtype(name: str, *dtypes: torch.dtype) -> torch.dtype:
    """The dtype of elementwise op ``name`` on operands of ``dtypes`` (promoted, or bool)."""
    if name in BOOL_RESULT_OPS:
        return torch.bool
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.float32": readable and valid Python


@dataclass(frozen=True)
class Load:
    """One memory read of an inner function: ``buffer`` at ``index`` (under ``mask``)."""

    buffer: str
    index: sympy.Expr
    masked: bool
    var: str


@dataclass
class TraceHandler:
    """Records an inner function's calls as lines ``tmpN = op(args)``, with CSE.

    ``loads`` lists every read with its sympy index; ``indirect`` the symbols created by
    ``indirect_indexing``. ``local_values`` maps a buffer name to the variable holding its
    value in the current kernel: a load of such a buffer reads the variable instead.
    """

    prefix: str = "tmp"
    lines: list[str] = field(default_factory=list)
    loads: list[Load] = field(default_factory=list)
    indirect: dict[str, sympy.Symbol] = field(default_factory=dict)
    local_values: dict[str, str] = field(default_factory=dict)
    symbols: set[sympy.Symbol] = field(default_factory=set)
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    _cse: dict[str, str] = field(default_factory=dict)
    _masks: list[str] = field(default_factory=list)
    _count: int = 0

    def _emit(self, rhs: str) -> str:
        if rhs in self._cse:
            return self._cse[rhs]
        name = f"{self.prefix}{self._count}"
        self._count += 1
        self.lines.append(f"{name} = {rhs}")
        self._cse[rhs] = name
        return name

    def _fmt(self, value: object) -> str:
        if isinstance(value, torch.dtype):
            return dtype_str(value)
        if isinstance(value, float):
            return (
                repr(value)
                if value == value and abs(value) != float("inf")
                else (f"float('{value}')")
            )
        return str(value)

    # -- structural ops ------------------------------------------------------------------
    def load(self, name: str, index: sympy.Expr) -> str:
        index = sympy.expand(index)
        self.symbols |= index.free_symbols
        mask = self._masks[-1] if self._masks else None
        if name in self.local_values:
            var = self.local_values[name]
            self.loads.append(Load(name, index, mask is not None, var))
            return var
        rhs = f"load({name}, {py_expr(index)}" + (f", mask={mask})" if mask else ")")
        var = self._emit(rhs)
        self.loads.append(Load(name, index, mask is not None, var))
        return var

    def constant(self, value: object, dtype: torch.dtype) -> str:
        var = self._emit(f"constant({self._fmt(value)}, {dtype_str(dtype)})")
        self.dtypes[var] = dtype
        return var

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        self.symbols |= sympy.sympify(expr).free_symbols
        var = self._emit(f"index_expr({py_expr(sympy.expand(expr))}, {dtype_str(dtype)})")
        self.dtypes[var] = dtype
        return var

    def to_dtype(self, x: str, dtype: torch.dtype) -> str:
        if self.dtypes.get(x) == dtype:  # already that dtype: no conversion to print
            return x
        var = self._emit(f"to_dtype({x}, {dtype_str(dtype)})")
        self.dtypes[var] = dtype
        return var

    def where(self, cond: str, a: str, b: str) -> str:
        return self._emit(f"where({cond}, {a}, {b})")

    def masked(self, mask: str, body: Callable[[], str], other: object) -> str:
        if self._masks:  # nested: the body runs only where every enclosing mask holds
            mask = self.logical_and(self._masks[-1], mask)
        self._masks.append(mask)
        try:
            value = body()
        finally:
            self._masks.pop()
        return self._emit(f"masked({mask}, {value}, {self._fmt(other)})")

    def indirect_indexing(self, x: str, size: sympy.Expr) -> sympy.Symbol:
        self.symbols |= sympy.sympify(size).free_symbols
        mask = self._masks[-1] if self._masks else None
        extra = f", mask={mask}" if mask else ""
        var = self._emit(f"indirect_indexing({x}, {py_expr(size)}{extra})")
        sym = sympy.Symbol(var, integer=True)
        self.indirect[var] = sym
        return sym

    def rand(self, seed: str, offset: str) -> str:
        return self._emit(f"rand({seed}, {offset})")

    def randn(self, seed: str, offset: str) -> str:
        return self._emit(f"randn({seed}, {offset})")

    def reduction(self, reduction_type: str, value: str, src_dtype: torch.dtype) -> str:
        return self._emit(f"reduction({reduction_type!r}, {value}, {dtype_str(src_dtype)})")

    def scan(self, scan_type: str, value: str, src_dtype: torch.dtype) -> str:
        return self._emit(f"scan({scan_type!r}, {value}, {dtype_str(src_dtype)})")

    def store(self, name: str, index: sympy.Expr, value: str, accumulate: bool = False) -> None:
        op = "store_add" if accumulate else "store"
        self.symbols |= sympy.sympify(index).free_symbols
        self.lines.append(f"{op}({name}, {py_expr(sympy.expand(index))}, {value})")

    def __getattr__(self, name: str) -> Callable[..., str]:
        if name in UNARY_OPS or name in BINARY_OPS:

            def op(*args: str) -> str:
                return self._emit(f"{name}({', '.join(self._fmt(a) for a in args)})")

            return op
        raise AttributeError(f"the ops handler has no operation {name!r}")


def trace(inner_fn: Callable[..., str], *index_args: object, handler: TraceHandler | None = None):
    """Run ``inner_fn(handler, *index_args)``; returns ``(handler, result variable)``."""
    handler = handler if handler is not None else TraceHandler()
    result = inner_fn(handler, *index_args)
    return handler, result
