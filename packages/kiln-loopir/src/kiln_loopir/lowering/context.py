"""The state of one lowering: the graph being built and helpers that add nodes to it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy
import torch

from kiln_loopir.ir import (
    Buffer,
    ComputedNode,
    ExternNode,
    LoopGraph,
    Pointwise,
    Reduction,
    Scan,
    Scatter,
    TensorRef,
)
from kiln_loopir.symbols import contiguous_strides, strided_index, to_expr

# A producer that computes inlined producers itself is inlined in turn while its inner
# function has at most this many operations (loads, index arithmetic and math): a batch
# norm's shift, a ReLU and (where the code generator vectorises masked strided reads) the
# padding of a max pooling read at each of its window's taps.
MAX_INLINED_OPS = 24


def val_layout(val: torch.Tensor) -> tuple[tuple, tuple, sympy.Expr]:
    """(size, stride, storage offset) of a (fake) tensor as sympy expressions."""
    size = tuple(to_expr(s) for s in val.shape)
    stride = tuple(to_expr(s) for s in val.stride())
    return size, stride, to_expr(val.storage_offset())


class LoweringContext:
    """Builds a :class:`LoopGraph`; lowerings add nodes through its methods.

    ``val`` is the fake-tensor value of the FX node being lowered (its size, stride and
    dtype are the truth the lowering must match).
    """

    def __init__(self, graph: LoopGraph) -> None:
        self.graph = graph
        self.graph_device = torch.device("cpu")  # where the graph's kernels run
        self.scans = False  # whether the code generator renders Scan nodes
        # whether it vectorises reads under a mask at a step (see _masked_steps)
        self.masked_strided_reads = True
        self.val: object = None
        self.arg_vals: tuple = ()
        self._count = 0
        self._seed_ref: TensorRef | None = None
        self._random_calls = 0
        self.reserved: set[str] = {i.name for i in graph.inputs}
        # buffers whose inner functions compute an inlined producer: inlined in turn only
        # while small (MAX_INLINED_OPS), so that recomputation stays bounded
        self.inliners: set[str] = set()
        self.inlined_now = False
        # the ops the nodes being added come from: the FX node's, after those of the
        # producers inlined into them (see :attr:`ComputedNode.origins`)
        self.origin: str | None = None
        self.inlined_origins: list[str] = []
        # per buffer an FX node made, how many ops read it (through views): the lowering
        # loop fills it as it goes
        self.readers: dict[str, int] = {}
        # the graph's buffers by name, found again when a name is not among them (a name
        # names one buffer for good: lowering adds nodes, it replaces no buffer)
        self._buffers: dict[str, Buffer] = {}
        # the computed nodes that alone write their buffer, by name, and the names written
        # more than once (or scattered into): both kept up to date with the nodes lowering
        # appends (see _new_nodes)
        self._producer_of: dict[str, ComputedNode] = {}
        self._written_again: set[str] = set()
        self._seen = {"buffers": (0, None), "producers": (0, None)}

    def origins(self) -> tuple[str, ...]:
        """The origins of a node added now: inlined producers' ops, then the FX node's."""
        found = [*self.inlined_origins, *([self.origin] if self.origin else [])]
        return tuple(dict.fromkeys(found))

    # -- buffers and nodes -------------------------------------------------------------
    def new_name(self) -> str:
        while True:
            name = f"buf{self._count}"
            self._count += 1
            if name not in self.reserved:
                return name

    def new_buffer(
        self,
        dtype: torch.dtype,
        device: torch.device,
        size: Sequence[sympy.Expr],
        stride: Sequence[sympy.Expr] | None = None,
    ) -> Buffer:
        size = tuple(sympy.sympify(s) for s in size)
        stride = tuple(stride) if stride is not None else contiguous_strides(size)
        return Buffer(self.new_name(), dtype, torch.device(device), size, stride)

    def _out_layout(self, val, size, stride, dtype):
        if val is not None:
            vsize, vstride, _ = val_layout(val)
            return vsize, vstride, val.dtype, val.device
        return size, stride, dtype, None

    def pointwise(
        self,
        inner_fn: Callable,
        *,
        dtype: torch.dtype | None = None,
        size: Sequence[sympy.Expr] | None = None,
        device: torch.device | None = None,
        val: torch.Tensor | None = None,
    ) -> TensorRef:
        """Add a Pointwise node; with ``val`` (a fake tensor) its buffer takes val's layout."""
        if val is None and size is None:
            val = self.val
        if val is not None:
            size, stride, _ = val_layout(val)
            dtype, device = val.dtype, val.device
        else:
            stride = None
        buf = self.new_buffer(dtype, device or self.device, size, stride)
        body = Pointwise(buf.size, inner_fn)
        self.graph.nodes.append(ComputedNode(buf, body, self.origins()))
        if self.inlined_now:
            self.inliners.add(buf.name)
        return buf.ref()

    def reduction(
        self,
        inner_fn: Callable,
        *,
        ranges: Sequence[sympy.Expr],
        reduction_ranges: Sequence[sympy.Expr],
        reduction_type: str,
        dtype: torch.dtype,
        src_dtype: torch.dtype,
        val: torch.Tensor | None = None,
        device: torch.device | None = None,
    ) -> TensorRef:
        """Add a Reduction node writing a buffer of size ``ranges`` (val's layout if given)."""
        stride = None
        if val is not None:
            size, stride, _ = val_layout(val)
            assert tuple(size) == tuple(sympy.sympify(r) for r in ranges), (size, ranges)
        buf = self.new_buffer(dtype, device or self.device, ranges, stride)
        body = Reduction(
            buf.size,
            tuple(sympy.sympify(r) for r in reduction_ranges),
            reduction_type,
            inner_fn,
            src_dtype,
        )
        self.graph.nodes.append(ComputedNode(buf, body, self.origins()))
        return buf.ref()

    def scan(
        self,
        inner_fn: Callable,
        *,
        dim: int,
        scan_type: str,
        dtype: torch.dtype,
        src_dtype: torch.dtype,
        val: torch.Tensor,
    ) -> TensorRef:
        """Add a Scan node along ``dim``; its buffer takes val's layout."""
        size, stride, _ = val_layout(val)
        buf = self.new_buffer(dtype, self.device, size, stride)
        body = Scan(buf.size, dim, scan_type, inner_fn, src_dtype)
        self.graph.nodes.append(ComputedNode(buf, body, self.origins()))
        return buf.ref()

    def scatter(
        self, target: TensorRef, ranges, inner_fn: Callable, index_fn: Callable, accumulate: bool
    ) -> None:
        buf = self.buffer(target.buffer)
        body = Scatter(tuple(sympy.sympify(r) for r in ranges), inner_fn, index_fn, accumulate)
        self.graph.nodes.append(ComputedNode(buf, body, self.origins()))

    def extern(self, target: object, args: tuple, kwargs: dict, val: object) -> object:
        """Add an ExternNode; returns a TensorRef (or a tuple) matching ``val``'s structure."""
        if isinstance(val, torch.Tensor):
            size, stride, _ = val_layout(val)
            buf = self.new_buffer(val.dtype, val.device, size, stride)
            self.graph.nodes.append(ExternNode(target, tuple(args), dict(kwargs), [buf]))
            return buf.ref()
        if isinstance(val, (tuple, list)) and all(_holdable(v) for v in val):
            # numbers among the results (attention's max sequence lengths) are known from
            # tracing: consumers get them as values, the host program drops them
            outs: list[Buffer | None] = []
            results: list[object] = []
            for v in val:
                if not isinstance(v, torch.Tensor):
                    outs.append(None)
                    results.append(to_expr(v) if isinstance(v, torch.SymInt) else v)
                    continue
                size, stride, _ = val_layout(v)
                outs.append(self.new_buffer(v.dtype, v.device, size, stride))
                results.append(outs[-1].ref())
            self.graph.nodes.append(
                ExternNode(target, tuple(args), dict(kwargs), outs, tuple_output=True)
            )
            return tuple(results)
        raise NotImplementedError(
            f"{target} returns {type(val).__name__}, which the extern fallback cannot hold: "
            "only ops returning tensors, or tuples of tensors and numbers, can run eagerly"
        )

    def inlined_loader(self, ref: TensorRef, *, through_views: bool = False) -> Callable:
        """``fn(ops, index)`` reading ``ref``; when ``ref`` views a Pointwise buffer, the
        producer's inner function is called instead (at the producer's index), so that a
        consumer reading it at other points (cat, padding, gather, a transpose) needs no
        buffer in between. Dead-node elimination drops the producer once nothing else
        reads it. Without ``through_views`` only a view of the whole buffer is inlined."""
        producers = self._producers()
        node = producers.get(ref.buffer)
        if node is None or not isinstance(node.body, Pointwise) or self._too_big(node):
            return ref.load
        if ref.is_whole(node.buffer):
            self._inlined(node)
            return node.body.inner_fn
        remap = _remap(ref, node.buffer) if through_views else None
        if remap is None or self._masked_steps(node, remap, len(ref.size)):
            return ref.load
        self._inlined(node)
        inner = self._with_same_point_producers(node, producers)
        return lambda ops, index: inner(ops, remap(index))

    def _with_same_point_producers(
        self, node: ComputedNode, producers: dict[str, ComputedNode]
    ) -> Callable:
        """``node``'s inner function, computing in place each small Pointwise producer of
        its own size that it reads whole at the point it computes, where ``node`` and the
        producer have no other reader (nothing is computed twice). ``node`` is read through
        a view (a transpose, the expand of a repeat), so its reads run in the consumer's
        iteration space; a producer left to them would stay in its own space, which fusion
        cannot join to the consumer's: Llama's rotary key ``k * cos + rotate_half(k) *
        sin``, read through the expand of grouped-query attention's repeat, wrote both
        products and read them back."""
        if self.readers.get(node.name) != 1:
            return node.body.inner_fn  # it stays written for its other readers
        size = tuple(node.body.ranges)  # the index its inner function takes
        same_point = {
            name: p
            for name, p in producers.items()
            if isinstance(p.body, Pointwise)
            and self.readers.get(name) == 1
            and tuple(p.body.ranges) == tuple(p.buffer.size) == size
            and not self._too_big(p)
        }
        if not same_point:
            return node.body.inner_fn

        def inner(ops, index):
            return node.body.inner_fn(_SamePointReads(ops, index, same_point, self), index)

        return inner

    def _masked_steps(self, node: ComputedNode, remap: Callable, rank: int) -> bool:
        """Whether inlining ``node`` through ``remap`` would read memory under a mask at a
        step of more than one element (a max pooling's taps, each a strided slice of the
        padded input) for a code generator that vectorises no such read (kiln-cpp: g++),
        so the producer is written once (the padding with it) and read plainly."""
        if self.masked_strided_reads or not any(load.masked for load in node.traced()[0].loads):
            return False
        xs = sympy.symbols(f"v0:{rank}", integer=True)
        return any(abs(e.coeff(x)) > 1 for e in map(sympy.sympify, remap(list(xs))) for x in xs)

    def _too_big(self, node: ComputedNode) -> bool:
        """Whether ``node`` computes inlined producers itself and is too big to inline."""
        return node.name in self.inliners and len(node.traced()[0].lines) > MAX_INLINED_OPS

    def _inlined(self, node: ComputedNode) -> None:
        self.inlined_now = True
        self.inlined_origins += node.origins

    def _producers(self) -> dict[str, ComputedNode]:
        """The computed nodes that alone write their buffer, by name (a buffer written
        twice, or scattered into, is read from memory). Not to be changed by the caller."""
        new = self._new_nodes("producers")
        if new is None:  # the nodes changed otherwise than by appending: all again
            self._producer_of, self._written_again = {}, set()
            new = self.graph.nodes
        for node in new:
            if not isinstance(node, ComputedNode):
                continue
            name = node.name
            if name in self._producer_of or name in self._written_again:
                self._producer_of.pop(name, None)
                self._written_again.add(name)
            elif isinstance(node.body, Scatter):
                self._written_again.add(name)
            else:
                self._producer_of[name] = node
        return self._producer_of

    def _new_nodes(self, reader: str) -> list | None:
        """The graph's nodes appended since ``reader`` last asked (all of them the first
        time), or None where the nodes it saw are no longer the list's first ones."""
        nodes = self.graph.nodes
        count, last = self._seen[reader]
        self._seen[reader] = (len(nodes), nodes[-1] if nodes else None)
        if count > len(nodes) or (count and nodes[count - 1] is not last):
            return None
        return nodes[count:]

    # -- lookups -------------------------------------------------------------------------
    def buffer(self, name: str) -> Buffer:
        found = self._buffers.get(name)
        if found is None:
            new = self._new_nodes("buffers")
            for node in new or ():
                if isinstance(node, ComputedNode):
                    self._buffers.setdefault(node.name, node.buffer)
                else:
                    self._buffers.update({b.name: b for b in node.outputs if b is not None})
            found = self._buffers.get(name)
        if found is None:  # an input or a constant added since, or nodes changed
            self._buffers = self.graph.buffers()
            self._seen["buffers"] = (len(self.graph.nodes), (self.graph.nodes or [None])[-1])
            found = self._buffers[name]
        return found

    @property
    def device(self) -> torch.device:
        val = self.val[0] if isinstance(self.val, (tuple, list)) else self.val
        return val.device if isinstance(val, torch.Tensor) else torch.device("cpu")

    # -- random numbers ------------------------------------------------------------------
    def random_seed(self) -> tuple[TensorRef, int]:
        """The graph's seed buffer and a fresh stream number for one random op.

        The host program draws one int64 seed per call with ``aten.randint`` on the graph's
        device, from that device's default generator (so ``torch.manual_seed`` makes runs
        repeatable, and a CUDA graph replaying the draw gets a new seed each replay); each
        random op mixes its own stream number into the element offset.
        """
        from kiln_loopir.runtime import SEED_HIGH

        if self._seed_ref is None:
            buf = self.new_buffer(torch.int64, self.device, (sympy.S.One,), (sympy.S.One,))
            kwargs = {"dtype": torch.int64, "device": self.device}
            draw = ExternNode(torch.ops.aten.randint.low, (0, SEED_HIGH, [1]), kwargs, [buf])
            self.graph.nodes.insert(0, draw)
            self._seed_ref = buf.ref()
        stream = self._random_calls
        self._random_calls += 1
        return self._seed_ref, stream


class _SamePointReads:
    """An ops handler that passes every call on to ``ops``, except a load of one of
    ``producers`` at element ``index`` of its own layout: that computes the producer there
    (see :meth:`LoweringContext._with_same_point_producers`)."""

    def __init__(self, ops, index, producers: dict[str, ComputedNode], ctx) -> None:
        self._ops, self._index, self._producers, self._ctx = ops, index, producers, ctx

    def __getattr__(self, name: str):
        return getattr(self._ops, name)

    def load(self, name: str, index: sympy.Expr, *args, **kwargs):
        producer = self._producers.get(name)
        if producer is not None and not (args or kwargs):
            here = strided_index(self._index, producer.buffer.stride)
            if sympy.expand(index - here) == 0:
                self._ctx._inlined(producer)  # and its own such producers, in turn
                return producer.body.inner_fn(self, self._index)
        return self._ops.load(name, index, *args, **kwargs)


def _remap(ref: TensorRef, buf: Buffer) -> Callable | None:
    """For a view that permutes, broadcasts, squeezes, unsqueezes, slices (with a step) or
    selects ``buf`` — each of buf's dimensions walked by at most one view dimension, at a
    whole multiple of its stride — ``fn(view index) -> buf index``; else None (a view that
    reshapes). With sizes that are not numbers, only a permuting view (offset 0, each of
    buf's dimensions taken whole)."""
    sizes = [*ref.size, *buf.size]
    if not all(isinstance(x, sympy.Integer) for x in (*sizes, *ref.stride, *buf.stride)):
        return _permuting_remap(ref, buf)
    if not isinstance(ref.offset, sympy.Integer):
        return None
    starts = _starts(int(ref.offset), buf)
    if starts is None:
        return None
    walks: dict[int, tuple[int, int]] = {}  # buf dimension -> (view dimension, step)
    for k, (m, vst) in enumerate(zip(ref.size, ref.stride, strict=True)):
        if m == 1 or vst == 0:
            continue  # a broadcast or a dimension of one: it walks nothing
        found = [
            (d, int(vst) // int(st))
            for d, (n, st) in enumerate(zip(buf.size, buf.stride, strict=True))
            if n > 1 and d not in walks and int(vst) % int(st) == 0 and int(vst) // int(st) > 0
            and starts[d] + int(vst) // int(st) * (int(m) - 1) < int(n)
        ]  # fmt: skip
        if len(found) != 1:
            return None
        d, step = found[0]
        walks[d] = (k, step)

    def remap(index):
        return [
            starts[d] + walks[d][1] * index[walks[d][0]] if d in walks else sympy.Integer(starts[d])
            for d in range(len(buf.size))
        ]

    return remap


def _starts(offset: int, buf: Buffer) -> list[int] | None:
    """The index in ``buf`` of its element at ``offset``, or None where none is there."""
    starts = [0] * len(buf.size)
    walked = sorted((d for d, n in enumerate(buf.size) if n > 1), key=lambda d: -int(buf.stride[d]))
    for d in walked:
        stride = int(buf.stride[d])
        if stride <= 0:
            return None
        starts[d], offset = divmod(offset, stride)
        if starts[d] >= int(buf.size[d]):
            return None
    return starts if offset == 0 else None


def _permuting_remap(ref: TensorRef, buf: Buffer) -> Callable | None:
    """For a view that permutes, broadcasts, squeezes or unsqueezes ``buf`` (offset 0, each
    of buf's dimensions taken whole by one view dimension), ``fn(view index) -> buf index``;
    else None."""
    if ref.offset != 0:
        return None
    taken: dict[int, int] = {}
    for d, (n, st) in enumerate(zip(buf.size, buf.stride, strict=True)):
        if n == 1:
            continue
        matches = [
            k
            for k, (m, vst) in enumerate(zip(ref.size, ref.stride, strict=True))
            if m == n and vst == st and k not in taken.values()
        ]
        if len(matches) != 1:
            return None
        taken[d] = matches[0]
    used = set(taken.values())
    for k, (m, vst) in enumerate(zip(ref.size, ref.stride, strict=True)):
        if k not in used and m != 1 and vst != 0:
            return None  # a view dimension that walks buf in a way no dimension does

    def remap(index):
        return [index[taken[d]] if d in taken else sympy.S.Zero for d in range(len(buf.size))]

    return remap


def _holdable(v: object) -> bool:
    """Whether an extern op's tuple result can hold ``v``: a tensor, or a number."""
    return v is None or isinstance(v, (torch.Tensor, int, float, bool, torch.SymInt))
