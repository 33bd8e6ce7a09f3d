"""The loop IR: buffers, the node kinds that fill them, and the graph that holds them.

The IR is closed and small:

- :class:`Buffer`: a named memory region with a dtype, device, size and stride (sympy).
- :class:`TensorRef`: a strided view of a buffer (size, stride, offset). Every view op
  (view, reshape, permute, expand, slice, select, squeeze, unsqueeze, as_strided ...) is
  an index remap expressed this way: reading element ``i`` of the view loads the buffer at
  ``offset + sum(i_k * stride_k)``.
- :class:`Pointwise`, :class:`Reduction`, :class:`Scan`, :class:`Scatter`: loop nests with
  a define-by-run ``inner_fn``; a :class:`ComputedNode` stores one of them into its buffer.
- :class:`ExternNode`: an ATen op run eagerly by the host program (matmul, convolution,
  attention, and every op with no lowering).
- :class:`LoopGraph`: inputs, nodes in program order, outputs; prints and verifies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import sympy
import torch

from kiln_loopir.ops import TraceHandler
from kiln_loopir.symbols import (
    index_vars,
    is_data_dependent,
    py_expr,
    reduction_vars,
    strided_index,
)

REDUCTION_TYPES = (
    "sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford.mean", "welford.m2",
    "dot",
)  # fmt: skip


# what a Scan combines: the running sum, product, maximum, minimum or logsumexp, or the
# position of the running maximum (minimum), the latest of equal values and of NaNs
SCAN_TYPES = ("sum", "prod", "max", "min", "logsumexp", "argmax", "argmin")


class IRError(AssertionError):
    """The IR broke one of its invariants (raised by ``verify()``)."""


def _dims(exprs: Sequence[sympy.Expr]) -> str:
    return "[" + ", ".join(py_expr(e) for e in exprs) + "]"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(eq=False)
class Buffer:
    """A named, strided memory region: what kernels write and read."""

    name: str
    dtype: torch.dtype
    device: torch.device
    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]

    def store_index(self, index: Sequence[sympy.Expr]) -> sympy.Expr:
        return strided_index(index, self.stride)

    def storage_numel(self) -> sympy.Expr:
        """Elements of storage the layout spans (0 for an empty tensor); worked out once
        per layout (memory planning asks it of every pair of buffers it compares)."""
        layout = (self.size, self.stride)
        known = self.__dict__.get("_storage_numel")
        if known is not None and known[0] == layout:
            return known[1]
        if any(s == 0 for s in self.size):
            numel = sympy.S.Zero
        else:
            pairs = zip(self.size, self.stride, strict=True)
            numel = sympy.expand(1 + sum(((s - 1) * st for s, st in pairs), 0))
        self.__dict__["_storage_numel"] = (layout, numel)
        return numel

    def nbytes(self) -> sympy.Expr:
        return self.storage_numel() * self.dtype.itemsize

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}{_dims(self.size)} stride={_dims(self.stride)}"

    def ref(self) -> TensorRef:
        """The whole buffer as a view of itself."""
        return TensorRef(self.name, self.dtype, self.device, self.size, self.stride, sympy.S.Zero)


@dataclass(frozen=True, eq=False)
class TensorRef:
    """A strided view of buffer ``buffer``: the value a lowered tensor node evaluates to."""

    buffer: str
    dtype: torch.dtype
    device: torch.device
    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    offset: sympy.Expr

    def index(self, index: Sequence[sympy.Expr]) -> sympy.Expr:
        return strided_index(index, self.stride, self.offset)

    def load(self, ops, index: Sequence[sympy.Expr]):
        """``ops.load`` of element ``index`` of the view."""
        return ops.load(self.buffer, self.index(index))

    def is_whole(self, buffer: Buffer) -> bool:
        return (
            tuple(self.size) == tuple(buffer.size)
            and tuple(self.stride) == tuple(buffer.stride)
            and self.offset == 0
        )

    def describe(self) -> str:
        return f"{self.buffer}{_dims(self.size)} stride={_dims(self.stride)} offset={self.offset}"


def _drop_ones(ranges: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    return [r for r in ranges if r != 1]


def _expand_loop_index(
    ranges: Sequence[sympy.Expr], loop_index: Sequence[sympy.Expr]
) -> list[sympy.Expr]:
    """Full index from the loop variables of the ranges that are not 1 (those get 0)."""
    it = iter(loop_index)
    out = [sympy.S.Zero if r == 1 else next(it) for r in ranges]
    assert next(it, None) is None
    return out


@dataclass(eq=False)
class PointLoop:
    """What Pointwise and Scatter share: ``inner_fn(ops, index)`` at every point of
    ``ranges``, no reduction loop. Not a node kind of its own (nodes are one of the
    subclasses), so ``isinstance(body, Pointwise)`` never matches a Scatter."""

    ranges: tuple[sympy.Expr, ...]
    inner_fn: Callable

    def loop_ranges(self) -> tuple[list[sympy.Expr], list[sympy.Expr]]:
        return _drop_ones(self.ranges), []

    def call(self, ops, loop_index, loop_rindex=()):
        return self.inner_fn(ops, _expand_loop_index(self.ranges, loop_index))


@dataclass(eq=False)
class Pointwise(PointLoop):
    """``buffer[index] = inner_fn(ops, index)`` for every ``index`` in ``ranges``."""

    kind = "Pointwise"

    def header(self) -> str:
        return f"Pointwise(ranges={_dims(self.ranges)})"


@dataclass(eq=False)
class Reduction:
    """``buffer[index] = reduce(type, inner_fn(ops, index, rindex) over rindex)``.

    ``reduction_type`` is one of :data:`REDUCTION_TYPES`; ``welford.mean`` and ``welford.m2``
    are the mean and the sum of squared deviations of one Welford reduction (a backend may
    compute both in one pass when they share a kernel). ``argmax``/``argmin`` give the
    row-major position in ``reduction_ranges``. ``dot`` is a sum (of products, a matrix
    product's) that accumulates in ``src_dtype`` itself, as BLAS does, where a backend may
    widen a ``sum``'s accumulator (kiln-cpp sums floats in double). ``src_dtype`` is the
    dtype of the values reduced; the buffer's dtype is the result's.
    """

    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    reduction_type: str
    inner_fn: Callable
    src_dtype: torch.dtype

    kind = "Reduction"

    def loop_ranges(self) -> tuple[list[sympy.Expr], list[sympy.Expr]]:
        return _drop_ones(self.ranges), _drop_ones(self.reduction_ranges)

    def call(self, ops, loop_index, loop_rindex):
        return self.inner_fn(
            ops,
            _expand_loop_index(self.ranges, loop_index),
            _expand_loop_index(self.reduction_ranges, loop_rindex),
        )

    def header(self) -> str:
        return (
            f"Reduction({self.reduction_type}, ranges={_dims(self.ranges)}, "
            f"reduction_ranges={_dims(self.reduction_ranges)})"
        )


@dataclass(eq=False)
class Scan:
    """``buffer[index] = scan(type, inner_fn(ops, index with j at dim) for j <= index[dim])``:
    a cumulative op along ``dim``.

    Its loops are the ranges but ``dim`` (the outer ones) and ``ranges[dim]``, walked in
    order (a kernel's reduction range): every step stores the running value.
    ``scan_type`` is one of :data:`SCAN_TYPES`; ``argmax``/``argmin`` give the position
    along ``dim`` (int64), ``src_dtype`` is the dtype of the values combined.
    """

    ranges: tuple[sympy.Expr, ...]
    dim: int
    scan_type: str
    inner_fn: Callable
    src_dtype: torch.dtype

    kind = "Scan"

    def outer_ranges(self) -> list[sympy.Expr]:
        return [r for d, r in enumerate(self.ranges) if d != self.dim]

    def loop_ranges(self) -> tuple[list[sympy.Expr], list[sympy.Expr]]:
        return _drop_ones(self.outer_ranges()), [self.ranges[self.dim]]

    def full_index(self, loop_index, loop_rindex) -> list[sympy.Expr]:
        outer = _expand_loop_index(self.outer_ranges(), loop_index)
        return [*outer[: self.dim], loop_rindex[0], *outer[self.dim :]]

    def call(self, ops, loop_index, loop_rindex):
        return self.inner_fn(ops, self.full_index(loop_index, loop_rindex))

    def header(self) -> str:
        return f"Scan({self.scan_type}, ranges={_dims(self.ranges)}, dim={self.dim})"


@dataclass(eq=False)
class Scatter(PointLoop):
    """``buffer[index_fn(ops, index)] (=|+=) inner_fn(ops, index)`` over ``ranges``.

    Writes into a buffer an earlier node filled (the copy of the scattered-into tensor);
    ``index_fn`` returns a storage offset that may use indirect-index symbols.
    """

    index_fn: Callable
    accumulate: bool

    kind = "Scatter"

    def call_index(self, ops, loop_index) -> sympy.Expr:
        return self.index_fn(ops, _expand_loop_index(self.ranges, loop_index))

    def header(self) -> str:
        mode = "add" if self.accumulate else "assign"
        return f"Scatter({mode}, ranges={_dims(self.ranges)})"


@dataclass(eq=False)
class ComputedNode:
    """A loop nest (Pointwise, Reduction, Scan or Scatter) that writes ``buffer``.

    ``origins`` names the aten ops the node was lowered from (``"aten.gelu.default"``), in
    order: the FX node's op (the op before decomposition where the graph records it) after
    those of the producers its inner function inlined. Kernel names are made of them."""

    buffer: Buffer
    body: Pointwise | Reduction | Scan | Scatter
    origins: tuple[str, ...] = ()
    _traced: tuple | None = field(default=None, repr=False)  # (body, layout, trace)
    # (body, layout, {how a kernel runs it: kernel.NodeTrace}): its shares of kernel traces
    _node_traces: tuple | None = field(default=None, repr=False)
    # (body, {(what, ranges, reduction ranges): its answer}): kernel.node_level's level in
    # a kernel over that space, kernel.inner_orders' loop orders (kernel._per_body)
    _levels: tuple | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.buffer.name

    def traced(self) -> tuple[TraceHandler, str, sympy.Expr]:
        """:meth:`trace`, made once per body and buffer layout, for readers that add
        nothing to the handler (verification, constant folding)."""
        layout = (self.buffer.size, self.buffer.stride)
        if self._traced is None or self._traced[0] is not self.body or self._traced[1] != layout:
            self._traced = (self.body, layout, self.trace())
        return self._traced[2]

    def trace(self, handler: TraceHandler | None = None) -> tuple[TraceHandler, str, sympy.Expr]:
        """Trace the body over fresh loop variables; returns (handler, value, store index)."""
        handler = handler or TraceHandler()
        p, r = self.body.loop_ranges()
        xs, rs = index_vars(len(p)), reduction_vars(len(r))
        value = self.body.call(handler, xs, rs)
        return handler, value, self.store_index(handler, xs, rs)

    def store_index(self, ops, loop_index, loop_rindex=()) -> sympy.Expr:
        if isinstance(self.body, Scatter):
            return sympy.expand(self.body.call_index(ops, loop_index))
        if isinstance(self.body, Scan):  # every step of the scan loop stores
            return self.buffer.store_index(self.body.full_index(loop_index, loop_rindex))
        return self.buffer.store_index(_expand_loop_index(self.body.ranges, loop_index))

    def format(self) -> list[str]:
        handler, value, index = self.trace()
        if isinstance(self.body, Reduction):
            value = handler.reduction(self.body.reduction_type, value, self.body.src_dtype)
        if isinstance(self.body, Scan):
            value = handler.scan(self.body.scan_type, value, self.body.src_dtype)
        accumulate = isinstance(self.body, Scatter) and self.body.accumulate
        handler.store(self.name, index, value, accumulate)
        lines = [f"{self.name}: {self.buffer.describe()} = {self.body.header()}"]
        return lines + ["    " + line for line in handler.lines]


@dataclass(eq=False)
class ExternNode:
    """An ATen op (or a host helper) run eagerly by the host program.

    ``args``/``kwargs`` hold TensorRefs where tensors go, sympy expressions for sizes, and
    plain Python values. ``outputs`` are the buffers of its results (``None`` for an unused
    one); ``tuple_output`` says whether the op returns a tuple. ``binds`` names the size
    symbols the call's result defines, each with the Python that takes it from the result
    (``""`` for the result itself, ``"[0][1]"`` ...): a number read from tensor data
    (``u0 = aten._local_scalar_dense(buf3)``) or the size of a view it bounds.
    """

    target: object
    args: tuple
    kwargs: dict
    outputs: list[Buffer | None]
    tuple_output: bool = False
    binds: list[tuple[sympy.Symbol, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        names = [b.name for b in self.outputs if b is not None]
        return names[0] if names else str(self.binds[0][0])

    def bound_symbols(self) -> set[sympy.Symbol]:
        """The data-dependent size symbols this node defines: those it ``binds`` and the
        bare sizes of its results an op decides at run time (nonzero's)."""
        found = {s for s, _ in self.binds}
        for buf in self.outputs:
            if buf is not None:
                found |= {e for e in buf.size if is_data_dependent(e)}
        return found

    def target_name(self) -> str:
        if isinstance(self.target, torch._ops.OpOverload):
            return (
                f"aten.{self.target.__name__}"
                if self.target.namespace == "aten"
                else str(self.target)
            )
        return getattr(self.target, "__name__", str(self.target))

    def input_refs(self) -> list[TensorRef]:
        refs: list[TensorRef] = []

        def visit(a):
            if isinstance(a, TensorRef):
                refs.append(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)

        visit(self.args)
        visit(list(self.kwargs.values()))
        return refs

    def format(self) -> list[str]:
        outs = ", ".join(
            [b.name if b is not None else "_" for b in self.outputs]
            + [f"{py_expr(s)}=result{path}" for s, path in self.binds]
        )
        args = ", ".join(
            [format_arg(a) for a in self.args]
            + [f"{k}={format_arg(v)}" for k, v in self.kwargs.items()]
        )
        lines = [f"{outs} = extern {self.target_name()}({args})"]
        lines += [f"    {b.name}: {b.describe()}" for b in self.outputs if b is not None]
        return lines


def format_arg(a: object) -> str:
    if isinstance(a, TensorRef):
        return a.describe()
    if isinstance(a, sympy.Expr):
        return py_expr(a)
    if isinstance(a, (list, tuple)):
        inner = ", ".join(format_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, torch.device):
        return f"device({str(a)!r})"
    return repr(a)


Node = ComputedNode | ExternNode


@dataclass(eq=False)
class GraphInput:
    """A placeholder: a tensor (its buffer), or a size (a sympy expression), or a scalar."""

    name: str
    buffer: Buffer | None = None
    expr: sympy.Expr | None = None
    value: object = None


@dataclass(eq=False)
class LoopGraph:
    """A lowered graph: inputs, nodes in program order, outputs.

    ``outputs`` holds a TensorRef per tensor output (with the size and stride eager gives),
    a sympy expression per size output, or a plain Python value.
    """

    inputs: list[GraphInput]
    nodes: list[Node] = field(default_factory=list)
    outputs: list[object] = field(default_factory=list)
    size_hints: dict[sympy.Symbol, int] = field(default_factory=dict)
    # tensors the graph holds (its get_attr nodes): name -> GraphInput with the tensor as value
    constants: list[GraphInput] = field(default_factory=list)

    def buffers(self) -> dict[str, Buffer]:
        found = {i.buffer.name: i.buffer for i in self.inputs if i.buffer is not None}
        found.update({c.buffer.name: c.buffer for c in self.constants})
        for node in self.nodes:
            if isinstance(node, ComputedNode):
                found.setdefault(node.buffer.name, node.buffer)
            else:
                found.update({b.name: b for b in node.outputs if b is not None})
        return found

    def size_symbols(self) -> set[str]:
        """Names of the size symbols: the inputs' and those of data-dependent sizes (numbers
        read from tensor data included)."""
        names = {s.name for s in self.size_hints}
        for buf in self.buffers().values():
            for e in (*buf.size, *buf.stride):
                names |= {s.name for s in e.free_symbols}
        for node in self.nodes:
            if isinstance(node, ExternNode):
                names |= {s.name for s in node.bound_symbols()}
        return names

    def hint(self, expr: sympy.Expr) -> int:
        """``expr`` evaluated at the example inputs' sizes (64 for data-dependent sizes)."""
        value = sympy.sympify(expr).subs(self.size_hints)
        if value.free_symbols:
            value = value.subs({s: 64 for s in value.free_symbols})
        return int(value)

    def format(self) -> str:
        lines = []
        for i in self.inputs:
            if i.buffer is not None:
                lines.append(f"input {i.name}: {i.buffer.describe()}")
            elif i.expr is not None:
                lines.append(f"input {i.name}: size {py_expr(i.expr)}")
            else:
                lines.append(f"input {i.name}: {i.value!r}")
        for c in self.constants:
            lines.append(f"constant {c.name}: {c.buffer.describe()}")
        for node in self.nodes:
            lines += node.format()
        lines.append("return (" + ", ".join(format_arg(o) for o in self.outputs) + ")")
        return "\n".join(lines)

    __str__ = format

    def verify(self) -> None:
        """Check the invariants of the IR; raise :class:`IRError` naming the first broken one."""
        from kiln_loopir.verify import verify_graph

        verify_graph(self)
