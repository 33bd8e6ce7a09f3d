"""Handing out a replay's outputs: over graph memory, or as fresh copies.

A graph writes its outputs into the same memory at every replay. Under
``mode="reduce-overhead"`` the caller gets tensors over that memory, made to raise once a
later replay overwrites them (:meth:`OutputPlan.hand_out`). Fresh outputs
(:meth:`OutputPlan.fresh`, the default mode) are copies: the bytes each group of outputs
sharing one block of graph memory spans are copied, all groups into one new block (small
groups in one multi-tensor copy, large ones a copy each; where the groups fill most of the
range of graph memory they lie in, as a backward's gradients do, that range in one copy),
and the outputs are rebuilt on it with their size, stride and offset (outputs that were
views of one another still are). An output that is an input, or a view of one, is rebuilt
on the caller's input of this call.

Fresh outputs may name some outputs ``kept``: a forward graph's saved tensors, which only
its backward reads and which die once it ran. Those are handed out over graph memory
without a copy (where no other output shares their memory), and :meth:`OutputPlan.in_use`
tells whether any of them is still alive: a later replay must not overwrite them then.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from kiln_cudagraphs.copies import CopyPlan

_ALIGN = 16  # bytes: copies start on this boundary, as the graph's memory did
# fresh outputs copy the whole range of graph memory their spans lie in, in one copy, where
# it holds at most this many times their bytes (the gaps cost less than a copy per span)
DENSE_RANGE = 1.25

OVERWRITTEN = (
    "accessing a tensor output of a kiln CUDA graph that a later replay has overwritten: "
    "an output stays valid until the next call of the same compiled graph (or of a graph "
    "recorded after it on the same device). Clone it (`out.clone()`) before calling again "
    "to keep it. For gradients kept in `.grad` across steps (gradient accumulation), set "
    "`.grad` to None before each backward, or run the step without mode='reduce-overhead'"
)
# ``set_access_error(storage_impl_pointer, message)`` makes every tensor on a storage raise
# ``message`` when its data is accessed: CUDA builds of torch only (None elsewhere, and
# outputs are copied).
set_access_error = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)


class UnsupportedOutput(Exception):
    """An output the replay could not hand out as the eager run does."""


@dataclass(frozen=True)
class InputAlias:
    """The output is input ``index`` itself, or a view of it ``delta`` elements further."""

    index: int
    same: bool
    size: tuple[int, ...]
    stride: tuple[int, ...]
    delta: int


@dataclass(frozen=True)
class GraphMemory:
    """The output lives in graph memory: in the copy of ``group``, at ``offset``."""

    group: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class NoElements:
    """A tensor output with no elements: nothing to copy, a new empty tensor each call."""

    dtype: torch.dtype
    device: torch.device
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class Constant:
    """A non-tensor output: returned as the capture returned it."""

    value: object


Placement = InputAlias | GraphMemory | NoElements | Constant


class OutputPlan:
    """How to hand out a recorded graph's outputs: worked out once, at capture."""

    def __init__(
        self,
        static_outputs: Sequence[object],
        static_inputs: Sequence[object],
        kept: Collection[int] = (),
    ):
        self.container = tuple if isinstance(static_outputs, tuple) else list
        input_of = {  # storage -> the first input in it
            _storage(x): i for i, x in reversed(list(enumerate(static_inputs))) if _has_elements(x)
        }
        in_graph_memory = [
            i for i, out in enumerate(static_outputs)
            if _has_elements(out) and _storage(out) not in input_of
        ]  # fmt: skip
        self.spans, where = _spans(static_outputs, in_graph_memory)
        self.placements: list[Placement] = []
        for i, out in enumerate(static_outputs):
            if not isinstance(out, torch.Tensor):
                placement = Constant(out)
            elif out.numel() == 0:
                placement = NoElements(out.dtype, out.device, tuple(out.shape), out.stride())
            elif i in where:
                group, start = where[i]
                offset = (_byte_offset(out) - start) // out.element_size()
                placement = GraphMemory(group, out.dtype, tuple(out.shape), out.stride(), offset)
            else:
                index = input_of[_storage(out)]
                placement = _input_alias(i, out, index, static_inputs[index])
            self.placements.append(placement)
        # for _assemble: the outputs in graph memory, then the inputs passed on as they are
        # (a forward's saved parameters), then the others; and each output's place in that
        self._elsewhere = [p for p in self.placements if not isinstance(p, GraphMemory)]
        kinds: dict[str, list[int]] = {"memory": [], "passed": [], "placed": []}
        for k, p in enumerate(self.placements):
            kind = "memory" if isinstance(p, GraphMemory) else "placed"
            kind = "passed" if isinstance(p, InputAlias) and p.same else kind
            kinds[kind].append(k)
        self._passed = _gather([self.placements[k].index for k in kinds["passed"]])
        self._placed = [self.placements[k] for k in kinds["placed"]]
        sits = {k: j for j, k in enumerate(kinds["memory"] + kinds["passed"] + kinds["placed"])}
        self._in_order = _gather([sits[k] for k in range(len(self.placements))])

        self.handed_out: torch.UntypedStorage | None = None  # the last outputs' storage
        self.kept_out: torch.UntypedStorage | None = None  # the last kept outputs' storage
        self._window = _window(self.spans, self.placements)
        # spans holding kept outputs only: fresh() hands them out over graph memory
        self._kept_groups = _kept_groups(len(self.spans), where, set(kept))
        copied = [p for p in self.placements if _copied(p, self._kept_groups)]
        kept_out = [p for p in self.placements if _kept(p, self._kept_groups)]
        self._block = _block_layout(self.spans, copied)
        self._kept_window = _window(self.spans, kept_out)
        # the outputs in graph memory, made over the window's storage or the block's copy
        in_memory = [p for p in self.placements if isinstance(p, GraphMemory)]
        self._window_views = _views(in_memory, self._window[2] if self._window else [])
        self._block_views = _views(copied, self._block[2])
        # the block's copy: from each span to its place in the block, or the whole range of
        # graph memory the spans lie in, as it is, where they fill most of it (a backward's
        # gradients: one copy instead of one per gradient)
        self._range = _dense_range(self.spans, copied, self._block[0])
        if self._range is not None:
            self._block = (self._range.numel(), {}, [])
            self._block_views = _views(copied, _window(self.spans, copied)[2])
        starts = self._block[1]
        self._block_sources = [self.spans[g] for g in starts]
        self._block_targets = _view_maker(
            [(torch.uint8, (span.numel(),), (1,), starts[g])
             for g, span in zip(starts, self._block_sources, strict=True)]
        )  # fmt: skip
        self._block_copy = CopyPlan([span.numel() for span in self._block_sources])
        self._kept_views = _views(kept_out, self._kept_window[2] if self._kept_window else [])

    @property
    def copy_bytes(self) -> int:
        """The bytes :meth:`fresh` copies at each call."""
        return self._block[0]

    def output_pointers(self) -> list[int]:
        """Where the outputs in graph memory start."""
        return [
            self.spans[p.group].data_ptr() + p.offset * p.dtype.itemsize
            for p in self.placements
            if isinstance(p, GraphMemory)
        ]

    def hand_out(self, inputs: Sequence[object]) -> tuple | list:
        """The outputs of the replay that just ran: over graph memory, where torch can make
        them raise once overwritten (see :meth:`invalidate`), else copied."""
        if set_access_error is None or self._window is None:
            return self.fresh(inputs)
        base, nbytes, _ = self._window
        device = self.spans[0].device
        storage = torch._C._construct_storage_from_data_pointer(base, device, nbytes)
        self.handed_out = storage
        return self._assemble(self._window_views(storage), inputs)

    def invalidate(self) -> None:
        """The graph memory is about to be overwritten: what was handed out raises."""
        if self.handed_out is not None:
            set_access_error(self.handed_out._cdata, OVERWRITTEN)
            self.handed_out = None

    def fresh(self, inputs: Sequence[object]) -> tuple | list:
        """The outputs of the replay that just ran, in one new block of memory; the kept
        ones over graph memory."""
        copies: list[torch.Tensor] = []
        nbytes = self._block[0]
        if nbytes:
            block = torch.empty(nbytes, dtype=torch.uint8, device=self.spans[0].device)
            storage = block.untyped_storage()
            if self._range is not None:
                block.copy_(self._range)
            else:
                self._block_copy(self._block_targets(storage), self._block_sources)
            copies = self._block_views(storage)
        if self._kept_window is None:
            return self._assemble(copies, inputs)
        base, size, _ = self._kept_window
        self.kept_out = torch._C._construct_storage_from_data_pointer(
            base, self.spans[0].device, size
        )
        kept, copied = iter(self._kept_views(self.kept_out)), iter(copies)
        in_memory = [
            next(kept) if p.group in self._kept_groups else next(copied)
            for p in self.placements
            if isinstance(p, GraphMemory)
        ]
        return self._assemble(in_memory, inputs)

    def in_use(self) -> bool:
        """Whether a kept output that :meth:`fresh` handed out last is still alive."""
        return self.kept_out is not None and _use_count(self.kept_out._cdata) > 1

    def _assemble(self, in_memory: list[torch.Tensor], inputs: Sequence[object]) -> tuple | list:
        """The outputs, in order: those in graph memory from ``in_memory``, the others
        placed by their kind."""
        if not self._elsewhere:
            return self.container(in_memory)
        made = [*in_memory, *self._passed(inputs), *(_place(p, inputs) for p in self._placed)]
        return self.container(self._in_order(made))


def _spans(
    outputs: Sequence[object], members: Sequence[int]
) -> tuple[list[torch.Tensor], dict[int, tuple[int, int]]]:
    """One byte span per storage the ``members`` outputs share, and for each output its
    span's index and start byte."""
    groups: dict[int, list[int]] = {}
    for i in members:
        groups.setdefault(_storage(outputs[i]), []).append(i)
    spans, where = [], {}
    for group in groups.values():
        span, start = _byte_span([outputs[i] for i in group])
        where.update({i: (len(spans), start) for i in group})
        spans.append(span)
    return spans, where


def _window(
    spans: Sequence[torch.Tensor], placements: Sequence[Placement]
) -> tuple[int, int, list[int | None]] | None:
    """``(base, nbytes, offsets)``: one address range holding the spans of the outputs in
    graph memory among ``placements``, and each output's offset in it, in elements of its
    dtype (None: not in graph memory)."""
    used = [spans[g] for g in _groups(placements)]
    if not used:
        return None
    base = min(span.data_ptr() for span in used)  # spans start on 16-byte boundaries
    end = max(span.data_ptr() + span.numel() for span in used)
    offsets: list[int | None] = []
    for p in placements:
        if not isinstance(p, GraphMemory):
            offsets.append(None)
            continue
        start = spans[p.group].data_ptr() - base
        offsets.append(start // p.dtype.itemsize + p.offset)
    return base, end - base, offsets


def _block_layout(
    spans: Sequence[torch.Tensor], placements: Sequence[Placement]
) -> tuple[int, dict[int, int], list[int | None]]:
    """``(nbytes, starts, offsets)``: the spans of the outputs in graph memory among
    ``placements`` laid end to end in one block (each from a 16-byte boundary, as in graph
    memory; ``starts``: span index -> its start), and each output's offset in the block, in
    elements of its dtype (None: not in graph memory)."""
    starts, nbytes = {}, 0
    for group in _groups(placements):
        starts[group] = nbytes
        nbytes += -(-spans[group].numel() // _ALIGN) * _ALIGN
    offsets = [
        starts[p.group] // p.dtype.itemsize + p.offset if isinstance(p, GraphMemory) else None
        for p in placements
    ]
    return nbytes, starts, offsets


def _gather(indices: Sequence[int]) -> Callable[[Sequence[object]], tuple]:
    """``lambda seq: tuple(seq[i] for i in indices)``, in one C call where it can."""
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    return lambda seq: tuple(seq[i] for i in indices)


def _dense_range(
    spans: Sequence[torch.Tensor], placements: Sequence[Placement], nbytes: int
) -> torch.Tensor | None:
    """A uint8 tensor over the range of graph memory that the spans of ``placements`` lie
    in (``nbytes`` in all), where that range is at most DENSE_RANGE times their bytes and
    they are more than one; else None."""
    window = _window(spans, placements)
    if window is None or len(_groups(placements)) < 2 or window[1] > DENSE_RANGE * nbytes:
        return None
    base, size, _ = window
    storage = torch._C._construct_storage_from_data_pointer(base, spans[0].device, size)
    return torch.empty(0, dtype=torch.uint8, device=spans[0].device).set_(storage)


def _groups(placements: Sequence[Placement]) -> list[int]:
    """The spans that the outputs in graph memory among ``placements`` lie in, in order."""
    return sorted({p.group for p in placements if isinstance(p, GraphMemory)})


def _kept_groups(n_spans: int, where: dict[int, tuple[int, int]], kept: set[int]) -> set[int]:
    """The spans that hold kept outputs and no other output."""
    members: dict[int, list[int]] = {}
    for i, (group, _) in where.items():
        members.setdefault(group, []).append(i)
    return {g for g in range(n_spans) if members.get(g) and set(members[g]) <= kept}


def _kept(p: Placement, kept_groups: set[int]) -> bool:
    return isinstance(p, GraphMemory) and p.group in kept_groups


def _copied(p: Placement, kept_groups: set[int]) -> bool:
    return isinstance(p, GraphMemory) and p.group not in kept_groups


# How many tensors (and storage objects) hold a storage: torch's own count.
_use_count = torch._C._storage_Use_Count


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _has_elements(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.numel() > 0


def _byte_offset(t: torch.Tensor) -> int:
    return t.storage_offset() * t.element_size()


def _byte_end(t: torch.Tensor) -> int:
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (t.storage_offset() + last + 1) * t.element_size()


def _byte_span(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """A uint8 view of the bytes ``tensors`` (sharing one storage) cover, and its start."""
    start = min(_byte_offset(t) for t in tensors) // _ALIGN * _ALIGN
    end = max(_byte_end(t) for t in tensors)
    storage = tensors[0].untyped_storage()
    span = torch.empty(0, dtype=torch.uint8, device=tensors[0].device)
    span.set_(storage, start, (end - start,), (1,))
    return span, start


def _input_alias(i: int, out: torch.Tensor, index: int, source: torch.Tensor) -> InputAlias:
    if out.dtype != source.dtype:
        raise UnsupportedOutput(
            f"output {i} is a {out.dtype} view of input {index} ({source.dtype})"
        )
    delta = out.storage_offset() - source.storage_offset()
    return InputAlias(index, out is source, tuple(out.shape), out.stride(), delta)


# --- tensors over a storage --------------------------------------------------------------

ViewSpec = tuple  # (dtype, size, stride, offset in elements)
ViewMaker = Callable[[torch.UntypedStorage], list]
_view_makers: list[Callable[[list[ViewSpec]], ViewMaker | None]] = []


def register_view_maker(factory: Callable[[list[ViewSpec]], ViewMaker | None]) -> None:
    """``factory(specs)`` returns a callable that makes, in one call, a new tensor over a
    storage for each ``(dtype, size, stride, offset)`` spec (or None: the next factory, at
    last the Python one, serves). Kiln registers kiln-cpp's ``TensorsOn``."""
    if factory not in _view_makers:
        _view_makers.insert(0, factory)


def _views(placements: Sequence[GraphMemory], offsets: Sequence[int | None]) -> ViewMaker:
    """The maker of the tensors of ``placements`` at their ``offsets`` over a storage."""
    specs = [
        (p.dtype, p.size, p.stride, offset)
        for p, offset in zip(placements, [o for o in offsets if o is not None], strict=True)
    ]
    return _view_maker(specs)


def _view_maker(specs: list[ViewSpec]) -> ViewMaker:
    """The first registered maker that serves ``specs``, else the Python one."""
    for factory in _view_makers:
        maker = factory(specs)
        if maker is not None:
            return maker
    return lambda storage: [
        torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
        for dtype, size, stride, offset in specs
    ]


def _place(p: Placement, inputs: Sequence[object]) -> object:
    """Output ``p`` of this call, where it is not in graph memory."""
    if isinstance(p, InputAlias):
        source = inputs[p.index]
        if p.same:
            return source
        return source.as_strided(p.size, p.stride, source.storage_offset() + p.delta)
    if isinstance(p, NoElements):
        return torch.empty_strided(p.size, p.stride, dtype=p.dtype, device=p.device)
    return p.value
