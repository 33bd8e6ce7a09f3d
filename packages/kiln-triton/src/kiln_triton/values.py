"""A kernel's body as a list of SSA values, recorded by driving ``Kernel.body``.

Rendering needs the whole body before it writes a line: which loads a reduction loop must
repeat, which dimensions merge, which tiling keeps loads coalesced. So the ops handler
here only records: each call makes a :class:`Value` (with common subexpressions shared)
and each store a :class:`Store`. A value is ``inner`` when it varies over the reduction
ranges (it reads an ``r`` variable, directly or through its arguments).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sympy
import torch

from kiln_loopir.kernel import Kernel
from kiln_loopir.ops import BINARY_OPS, UNARY_OPS, result_dtype
from kiln_triton.errors import TritonCodegenError


@dataclass(eq=False)
class Value:
    name: str
    op: str  # an elementwise op name, or load/constant/index/convert/where/masked/...
    args: tuple[Value, ...]
    dtype: torch.dtype
    inner: bool
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class Store:
    buffer: str
    index: sympy.Expr
    value: Value
    accumulate: bool
    deps: tuple[Value, ...]  # indirect indices the index uses
    inner: bool
    after: int  # how many values were recorded before it


def is_reduction_var(s: sympy.Symbol) -> bool:
    return s.name.startswith("r") and s.name[1:].isdigit()


def is_index_var(s: sympy.Symbol) -> bool:
    return s.name[:1] in ("x", "r") and s.name[1:].isdigit()


class RecordingHandler:
    """The ops handler that records a kernel's body (see the module docstring)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.buffer_dtypes = {n.name: n.buffer.dtype for n in kernel.nodes}
        self.buffer_dtypes.update(kernel.arg_dtypes)
        self.values: list[Value] = []
        self.stores: list[Store] = []
        self.indirect: dict[str, Value] = {}
        self.local_values: dict[str, Value] = {}
        self._cse: dict[tuple, Value] = {}
        self._masks: list[Value] = []

    # -- helpers ---------------------------------------------------------------------------
    def _value(self, op: str, args, dtype, inner=None, **attrs) -> Value:
        key = (op, tuple(id(a) for a in args), dtype, *(_attr_key(attrs[k]) for k in sorted(attrs)))
        if key in self._cse:
            return self._cse[key]
        if inner is None:
            inner = any(a.inner for a in args)
        v = Value(f"tmp{len(self.values)}", op, tuple(args), dtype, inner, attrs)
        self.values.append(v)
        self._cse[key] = v
        return v

    def _index_deps(self, index: sympy.Expr) -> tuple[list[Value], bool]:
        """The indirect values ``index`` reads and whether it varies over ``r``."""
        deps, inner = [], False
        for s in sympy.sympify(index).free_symbols:
            if s.name in self.indirect:
                deps.append(self.indirect[s.name])
                inner |= self.indirect[s.name].inner
            elif is_reduction_var(s):
                inner = True
        return sorted(deps, key=lambda v: int(v.name[3:])), inner

    def buffer_dtype(self, name: str) -> torch.dtype:
        if name in self.buffer_dtypes:
            return self.buffer_dtypes[name]
        raise TritonCodegenError(
            f"{self.kernel.name}: buffer {name} has no dtype in kernel.arg_dtypes; "
            "run kiln_loopir's kernel_launch_args on the schedule before rendering"
        )

    # -- structural ops --------------------------------------------------------------------
    def load(self, name: str, index: sympy.Expr) -> Value:
        if name in self.local_values:
            return self.local_values[name]
        index = sympy.expand(index)
        deps, inner = self._index_deps(index)
        mask = self._masks[-1] if self._masks else None
        args = deps + ([mask] if mask is not None else [])
        inner = inner or any(a.inner for a in args)
        return self._value("load", args, self.buffer_dtype(name), inner, buffer=name,
                           index=index, mask=mask)  # fmt: skip

    def constant(self, value: object, dtype: torch.dtype) -> Value:
        return self._value("constant", (), dtype, False, value=value)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Value:
        expr = sympy.expand(expr)
        deps, inner = self._index_deps(expr)
        inner = inner or any(a.inner for a in deps)
        return self._value("index", deps, dtype, inner, index=expr)

    def to_dtype(self, x: Value, dtype: torch.dtype) -> Value:
        if x.dtype == dtype:
            return x
        return self._value("convert", (x,), dtype)

    def where(self, cond: Value, a: Value, b: Value) -> Value:
        return self._value("where", (cond, a, b), result_dtype("where", a.dtype, b.dtype))

    def masked(self, mask: Value, body: Callable[[], Value], other: object) -> Value:
        if self._masks:
            mask = self.logical_and(self._masks[-1], mask)
        self._masks.append(mask)
        try:
            value = body()
        finally:
            self._masks.pop()
        return self._value("masked", (mask, value), value.dtype, other=other)

    def indirect_indexing(self, x: Value, size: sympy.Expr, mask: object = None) -> sympy.Symbol:
        v = self._value("indirect", (x,), torch.int64, size=sympy.sympify(size))
        self.indirect[v.name] = v
        return sympy.Symbol(v.name, integer=True)

    def rand(self, seed: Value, offset: Value) -> Value:
        return self._value("rand", (seed, offset), torch.float32)

    def randn(self, seed: Value, offset: Value) -> Value:
        return self._value("randn", (seed, offset), torch.float32)

    def reduction(self, reduction_type: str, value: Value, src_dtype: torch.dtype) -> Value:
        value = self.to_dtype(value, src_dtype)
        if reduction_type == "dot":  # a matrix product's sum: Triton's sums accumulate in float
            reduction_type = "sum"
        if reduction_type in ("argmax", "argmin"):
            out = torch.int64
        elif reduction_type in ("any", "all"):
            out = torch.bool
        else:
            out = src_dtype
        return self._value("reduction", (value,), out, False, type=reduction_type, src=src_dtype)

    def scan(self, scan_type: str, value: Value, src_dtype: torch.dtype) -> Value:
        value = self.to_dtype(value, src_dtype)
        out = torch.int64 if scan_type in ("argmax", "argmin") else src_dtype
        return self._value("scan", (value,), out, True, type=scan_type, src=src_dtype)

    def store(self, name: str, index: sympy.Expr, value: Value, accumulate: bool = False) -> None:
        index = sympy.expand(index)
        deps, inner = self._index_deps(index)
        inner = inner or value.inner or any(d.inner for d in deps)
        self.stores.append(Store(name, index, value, accumulate, tuple(deps), inner,
                                 len(self.values)))  # fmt: skip

    # -- elementwise ops -------------------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., Value]:
        if name not in UNARY_OPS and name not in BINARY_OPS:
            raise AttributeError(f"the ops handler has no operation {name!r}")

        def op(*args: Value) -> Value:
            return self._value(name, args, result_dtype(name, *(a.dtype for a in args)))

        return op


def record(kernel: Kernel) -> RecordingHandler:
    handler = RecordingHandler(kernel)
    kernel.body(handler)
    return handler


def _attr_key(value: object) -> tuple:
    """What tells one attribute of a value from another: the value itself with its type (a
    sympy index compares by its structure, without printing it), else its repr."""
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return (type(value), value)
