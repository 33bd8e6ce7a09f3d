"""Kernels: fused groups of IR nodes over one iteration space, and the Schedule.

A :class:`Kernel` iterates over ``ranges`` (the outer, parallel loops: variables ``x0 ..``)
and ``reduction_ranges`` (the inner loops: ``r0 ..``). Each of its nodes runs at one level:

- ``outer``: a Pointwise node whose loop ranges equal ``ranges``: once per outer point;
- ``inner``: a Pointwise node whose loop ranges equal ``ranges + reduction_ranges``: once
  per point of the whole space;
- ``reduction``: a Reduction node with ``(ranges, reduction_ranges)`` as its loop ranges:
  reduces over the inner loops, once per outer point;
- ``scan``: a Scan node with ``(ranges, reduction_ranges)`` as its loop ranges: walks the
  one inner loop in order, storing the running value at every step. A kernel with a scan
  holds nothing else (the fusion rules keep it alone).

Nodes run in order at each outer point. A node reads a buffer written earlier in the same
kernel only at the point where it was written (the fusion rule guarantees it), so the value
is a variable of the kernel; ``local_buffers`` are never written to memory at all.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import sympy
import torch

from kiln_loopir.ir import (
    ComputedNode,
    ExternNode,
    LoopGraph,
    Pointwise,
    Reduction,
    Scan,
    Scatter,
    _dims,
)
from kiln_loopir.ops import TraceHandler
from kiln_loopir.symbols import index_vars, reduction_vars


def _equal(x, y) -> bool:
    """Whether two size expressions are equal (structurally equal ones, and integers,
    without sympy's expand)."""
    if x == y:
        return True
    if _is_integer(x) and _is_integer(y):
        return False
    return sympy.expand(x - y) == 0


def _is_integer(x) -> bool:
    return isinstance(x, int) or (isinstance(x, sympy.Basic) and x.is_Integer)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))


def node_level(node: ComputedNode, ranges, reduction_ranges) -> str | None:
    """The level ``node`` runs at in a kernel over this space (loop order kept), or None;
    found once per body and space (fusion asks again for every pair a node is part of)."""
    return _per_body(node, _body_level, ranges, reduction_ranges)


def _per_body(node: ComputedNode, find, ranges, reduction_ranges):
    """``find(node.body, ranges, reduction_ranges)``, worked out once per body, space and
    ``find`` (kept on the node, dropped when its body changes)."""
    memo = node._levels
    if memo is None or memo[0] is not node.body:
        memo = node._levels = (node.body, {})
    key = (find, tuple(ranges), tuple(reduction_ranges))
    if key not in memo[1]:
        memo[1][key] = find(node.body, ranges, reduction_ranges)
    return memo[1][key]


def _body_level(body, ranges, reduction_ranges) -> str | None:
    p, r = body.loop_ranges()
    if isinstance(body, (Reduction, Scan)):
        fits = _same(p, ranges) and _same(r, reduction_ranges)
        return ("reduction" if isinstance(body, Reduction) else "scan") if fits else None
    if _same(p, ranges):
        return "outer"
    if reduction_ranges and _same(p, list(ranges) + list(reduction_ranges)):
        return "inner"
    return None


MAX_ORDERS = 24


def inner_orders(node: ComputedNode, ranges, reduction_ranges) -> list[tuple[int, ...]]:
    """Ways a Pointwise node can run at the inner level with its loops reordered: each is a
    tuple giving, for each of the node's loop dimensions, the kernel dimension it takes
    (in ``itertools.permutations`` order, at most :data:`MAX_ORDERS`); found once per body
    and space, as :func:`node_level` is."""
    return _per_body(node, _inner_orders, ranges, reduction_ranges)


def _inner_orders(body, ranges, reduction_ranges) -> list[tuple[int, ...]]:
    p, _ = body.loop_ranges()
    full = list(ranges) + list(reduction_ranges)
    if isinstance(body, (Reduction, Scan)) or not reduction_ranges or len(p) != len(full):
        return []
    # which kernel dimensions each of the node's dimensions may take, smallest first: the
    # search below then meets the orders in lexicographic order
    fits = [[j for j, size in enumerate(full) if _equal(p[i], size)] for i in range(len(p))]
    found: list[tuple[int, ...]] = []
    order: list[int] = []

    def extend() -> None:
        if len(order) == len(p):
            found.append(tuple(order))
            return
        for j in fits[len(order)]:
            if j not in order and len(found) < MAX_ORDERS:
                order.append(j)
                extend()
                order.pop()

    extend()
    return found


class EventTrace(TraceHandler):
    """A trace that also keeps the order of loads, stores and reductions: ``("load", name)``,
    ``("store", name)``, ``("reduction", type)``."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def load(self, name, index):
        self.events.append(("load", name))
        return super().load(name, index)

    def store(self, name, index, value, accumulate=False):
        self.events.append(("store", name))
        return super().store(name, index, value, accumulate)

    def reduction(self, reduction_type, value, src_dtype):
        self.events.append(("reduction", reduction_type))
        return super().reduction(reduction_type, value, src_dtype)


@dataclass(frozen=True, eq=False)
class KernelTrace:
    """What one trace of a kernel's body tells the scheduler and memory planning."""

    handler: EventTrace
    stores: dict[str, sympy.Expr]  # each node's store index
    reads: frozenset[str]  # buffers loaded from memory (not produced in the kernel)
    symbols: frozenset[sympy.Symbol]
    same_point_reads: bool  # every read of a buffer the kernel produces is at its store

    @staticmethod
    def of(kernel: Kernel) -> KernelTrace:
        handler = EventTrace()
        parts = kernel.node_traces()
        if parts is None:  # a node indexes indirectly: its symbols are named per trace
            stores = kernel.body(handler)
        else:  # the events, loads and symbols the kernel's readers use, node by node
            stores = {}
            for node, part in zip(kernel.nodes, parts, strict=True):
                handler.events += part.events
                handler.loads += part.loads
                handler.symbols |= part.symbols
                stores[node.name] = part.store
        same_point = all(
            same_point_index(load.index, stores[load.buffer])
            for load in handler.loads
            if load.buffer in stores
        )
        loads = {load.buffer for load in handler.loads}
        return KernelTrace(
            handler,
            stores,
            frozenset(loads - kernel.writes()),
            frozenset(handler.symbols),
            same_point,
        )


@functools.lru_cache(maxsize=1 << 16)
def same_point_index(load: sympy.Expr, store: sympy.Expr) -> bool:
    """Whether a load at index ``load`` reads the point a store at ``store`` wrote: the
    same expression, else one that expands to it. Kept per pair: every fusion a kernel
    takes part in checks its reads again, and most are the same expression."""
    return load == store or sympy.expand(load - store) == 0


@dataclass(frozen=True)
class NodeTrace:
    """What one node adds to a kernel's :class:`EventTrace`: its events and loads in order,
    the symbols they mention and its store index. A node's share does not depend on the
    nodes around it (a load of a buffer made earlier in the kernel is recorded all the
    same), only on how the kernel runs it: its level, the loop variables it is given and
    whether it stores."""

    events: tuple
    loads: tuple
    symbols: frozenset
    store: sympy.Expr
    indirect: bool  # it made symbols of indirect indexing (named by the handler's count)

    @staticmethod
    def of(node: ComputedNode, how: tuple) -> NodeTrace:
        """``node``'s share when a kernel runs it ``how`` (see :meth:`Kernel.node_traces`),
        traced once per body and buffer layout."""
        layout = (node.buffer.size, node.buffer.stride)
        memo = node._node_traces
        if memo is None or memo[0] is not node.body or memo[1] != layout:
            memo = node._node_traces = (node.body, layout, {})
        found = memo[2].get(how)
        if found is None:
            level, n_ranges, n_reduction, order, stored = how
            handler = EventTrace()
            store = run_node(handler, node, level, n_ranges, n_reduction, order, stored)
            found = NodeTrace(
                tuple(handler.events),
                tuple(handler.loads),
                frozenset(handler.symbols),
                store,
                bool(handler.indirect),
            )
            memo[2][how] = found
        return found


def run_node(ops, node: ComputedNode, level: str, n_ranges: int, n_reduction: int,
             order: tuple[int, ...] | None, stored: bool) -> sympy.Expr:  # fmt: skip
    """Drive ``ops`` through one node of a kernel over ``n_ranges`` outer and
    ``n_reduction`` reduction loops: its inner function at ``level`` (an inner node's loops
    reordered by ``order``), its reduction or scan, and its store where ``stored``.
    Returns its store index; ``ops.local_values`` gets its value variable."""
    xs, rs = index_vars(n_ranges), reduction_vars(n_reduction)
    if level == "inner":
        loops = xs + rs
        if order is not None:
            loops = [loops[d] for d in order]
        value = node.body.call(ops, loops, [])
        index = node.store_index(ops, loops)
    else:
        value = node.body.call(ops, xs, rs)
        index = node.store_index(ops, xs, rs)
    if isinstance(node.body, Reduction):
        value = ops.reduction(node.body.reduction_type, value, node.body.src_dtype)
    if isinstance(node.body, Scan):
        value = ops.scan(node.body.scan_type, value, node.body.src_dtype)
    accumulate = isinstance(node.body, Scatter) and node.body.accumulate
    if stored:
        ops.store(node.name, index, value, accumulate)
    if not isinstance(node.body, Scatter):
        ops.local_values[node.name] = value
    return index


@dataclass(eq=False)
class Kernel:
    """Fused IR nodes over one iteration space; what a codegen backend renders."""

    name: str
    ranges: list[sympy.Expr]
    reduction_ranges: list[sympy.Expr]
    nodes: list[ComputedNode]
    local_buffers: set[str] = field(default_factory=set)
    # set by memory planning: buffer names passed to the kernel, in launch order
    args: list[str] = field(default_factory=list)
    size_args: list[sympy.Symbol] = field(default_factory=list)
    # set by memory planning: the dtype of every buffer in ``args``
    arg_dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    # inner nodes whose loops run reordered: node name -> kernel dimension of each loop
    orders: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _traced: tuple | None = field(default=None, repr=False)  # (state, KernelTrace)
    _writes: tuple | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return self.nodes[0].buffer.device

    def writes(self) -> frozenset[str]:
        key = tuple(id(n) for n in self.nodes)
        if self._writes is None or self._writes[0] != key:
            self._writes = (key, frozenset(n.name for n in self.nodes))
        return self._writes[1]

    def stored_buffers(self) -> list[str]:
        """Buffers the kernel writes to memory, in node order."""
        seen: list[str] = []
        for n in self.nodes:
            if n.name not in self.local_buffers and n.name not in seen:
                seen.append(n.name)
        return seen

    def reads(self) -> set[str]:
        """Buffers the kernel loads from memory (not produced inside it)."""
        return set(self.traced().reads)

    def symbols(self) -> frozenset[sympy.Symbol]:
        """The symbols the kernel's indices and index expressions mention."""
        return self.traced().symbols

    def traced(self) -> KernelTrace:
        """The trace of :meth:`body`, made once per state of the kernel (its nodes,
        space, loop orders and local buffers: what the trace depends on)."""
        state = (
            tuple(id(n) for n in self.nodes),
            tuple(self.ranges),
            tuple(self.reduction_ranges),
            tuple(sorted(self.orders.items())),
            frozenset(self.local_buffers),
        )
        if self._traced is None or self._traced[0] != state:
            self._traced = (state, KernelTrace.of(self))
        return self._traced[1]

    def levels(self) -> list[str | None]:
        levels = []
        for n in self.nodes:
            level = node_level(n, self.ranges, self.reduction_ranges)
            if level is None and n.name in self.orders:
                ok = self.orders[n.name] in inner_orders(n, self.ranges, self.reduction_ranges)
                level = "inner" if ok else None
            levels.append(level)
        return levels

    def body(self, ops) -> dict[str, sympy.Expr]:
        """Drive ``ops`` through the whole kernel: every node's inner function, its
        reduction and its store (skipped for local buffers). ``ops.local_values`` gets each
        produced buffer's value variable. Returns each node's store index."""
        stores: dict[str, sympy.Expr] = {}
        for node, how in zip(self.nodes, self._runs(), strict=True):
            stores[node.name] = run_node(ops, node, *how)
        return stores

    def node_traces(self) -> list[NodeTrace] | None:
        """Each node's share of the kernel's trace, or None where a node indexes
        indirectly (the kernel is traced whole)."""
        parts = [
            NodeTrace.of(node, how) for node, how in zip(self.nodes, self._runs(), strict=True)
        ]
        return None if any(part.indirect for part in parts) else parts

    def _runs(self) -> list[tuple]:
        """How each node runs: ``(level, outer loops, reduction loops, order, stored)``."""
        runs = []
        for node, level in zip(self.nodes, self.levels(), strict=True):
            if level is None:
                raise ValueError(f"{node.name} does not fit the iteration space of {self.name}")
            order = self.orders.get(node.name) if level == "inner" else None
            stored = node.name not in self.local_buffers
            runs.append((level, len(self.ranges), len(self.reduction_ranges), order, stored))
        return runs

    def trace(self) -> TraceHandler:
        handler = TraceHandler()
        self.body(handler)
        return handler

    def same_point_reads(self) -> bool:
        """Whether every read of a buffer produced in this kernel is at its store index."""
        return self.traced().same_point_reads

    def has_scan(self) -> bool:
        return any(isinstance(n.body, Scan) for n in self.nodes)

    def header(self) -> str:
        kinds = ", ".join(
            f"{n.name}:{level}" + (f"{list(self.orders[n.name])}" if n.name in self.orders else "")
            for n, level in zip(self.nodes, self.levels(), strict=True)
        )
        return (
            f"{self.name}: ranges={_dims(self.ranges)} "
            f"reduction_ranges={_dims(self.reduction_ranges)} nodes=[{kinds}]"
        )

    def format(self) -> list[str]:
        lines = [self.header()]
        if self.local_buffers:
            lines.append("    # local: " + ", ".join(sorted(self.local_buffers)))
        return lines + ["    " + line for line in self.trace().lines]


def kernel_of(node: ComputedNode, name: str) -> Kernel:
    """A kernel holding just ``node`` (a Pointwise runs outer, a Reduction reduces)."""
    p, r = node.body.loop_ranges()
    if isinstance(node.body, (Pointwise, Scatter)):
        r = []
    return Kernel(name, list(p), list(r), [node])


Step = Kernel | ExternNode


@dataclass(eq=False)
class Schedule:
    """The graph as an ordered list of steps: kernels and extern calls."""

    graph: LoopGraph
    steps: list[Step]

    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    def format(self) -> str:
        lines = []
        for i in self.graph.inputs:
            if i.buffer is not None:
                lines.append(f"input {i.name}: {i.buffer.describe()}")
        for step in self.steps:
            if isinstance(step, Kernel):
                lines += step.format()
            else:
                lines += step.format()
        from kiln_loopir.ir import format_arg

        lines.append("return (" + ", ".join(format_arg(o) for o in self.graph.outputs) + ")")
        return "\n".join(lines)

    __str__ = format

    def verify(self) -> None:
        """Check the schedule's invariants; raise IRError naming the first broken one."""
        from kiln_loopir.verify import verify_schedule

        verify_schedule(self)
