"""The memory pool every graph of one device is recorded into, and what a replay overwrites.

All graphs of a device share one pool (a training step's forward and backward graphs
among them), so that one graph's outputs can be the next graph's inputs, read where they
are. A graph's outputs are held for as long as the graph is, so no later capture places
anything over them; but a later capture may place its outputs in memory that an earlier
graph used for its intermediates and frees inside its own replay. So a replay of graph
``g`` overwrites the outputs of ``g`` and may overwrite those of every graph recorded
after ``g`` in the same pool: :meth:`GraphPool.replaying` makes the tensors those graphs
handed out raise when read (see ``outputs.py``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Protocol

import torch


class PoolMember(Protocol):
    def invalidate_outputs(self) -> None:
        """Make the outputs handed out so far raise when read."""
        ...

    def output_pointers(self) -> list[int]: ...

    def outputs_in_use(self) -> bool:
        """Whether outputs handed out over graph memory that must not be overwritten
        (fresh outputs' kept ones) are still alive."""
        ...


class GraphPool:
    """One memory pool and the graphs recorded into it, in the order they were recorded.

    Replays on two streams could run at once over the same memory: a replay on another
    stream than the last one's first makes its stream wait for the last one's work."""

    def __init__(self, handle: object = None, device_index: int | None = None) -> None:
        self.handle = handle
        self.device_index = device_index  # None: no stream to keep to (the runner's tests)
        # the last replay's stream, as torch names a stream: (id, device index, device type)
        self.stream: tuple[int, int, int] | None = None
        self._graphs: list[weakref.ref] = []
        self._owner: dict[int, weakref.ref] = {}  # output data pointer -> its graph

    def renew(self) -> None:
        """After a capture into the pool failed: torch may still hold the pool as being
        recorded into, so later captures go to a new one."""
        self.handle = torch.cuda.graph_pool_handle()

    def add(self, graph: PoolMember) -> None:
        """Note ``graph`` as recorded now, and where its outputs live."""
        ref = weakref.ref(graph)
        self._graphs.append(ref)
        for pointer in graph.output_pointers():
            self._owner[pointer] = ref

    def remove(self, graph: PoolMember) -> None:
        """``graph`` is dropped: its memory goes back to the pool, so what it handed out
        must not be read any more."""
        graph.invalidate_outputs()
        self._graphs = [r for r in self._graphs if r() is not None and r() is not graph]
        self._owner = {p: r for p, r in self._owner.items() if r() is not None and r() is not graph}

    def owner(self, pointer: int) -> PoolMember | None:
        """The graph whose output lives at ``pointer`` (the start of a tensor), or None."""
        ref = self._owner.get(pointer)
        return ref() if ref is not None else None

    def overwrites_live_outputs(self, graph: PoolMember) -> bool:
        """Whether a replay of ``graph`` would overwrite kept outputs still alive: its
        own, or those of a graph recorded after it."""
        return any(member.outputs_in_use() for member in self._this_and_later(graph))

    def replaying(self, graph: PoolMember) -> None:
        """``graph`` replays next: invalidate what it and every later graph handed out.
        Call :meth:`order_streams` first, and read the inputs before this (an input may be
        an output of the last replay, which raises once invalidated)."""
        for member in self._this_and_later(graph):
            member.invalidate_outputs()

    def _this_and_later(self, graph: PoolMember) -> Iterator[PoolMember]:
        """``graph`` and the graphs recorded after it that are still alive: what a replay
        of ``graph`` may overwrite."""
        later = False
        for ref in self._graphs:
            member = ref()
            later = later or member is graph
            if later and member is not None:
                yield member

    def order_streams(self) -> None:
        """A replay on another stream than the last replay's (another thread's, or a
        ``torch.cuda.stream`` block) waits for all the work queued on that stream so far:
        the two replays never run at once over the same memory."""
        if self.device_index is None:
            return
        current = _current_stream(self.device_index)  # no Stream object at every call
        if self.stream is not None and current != self.stream:
            _stream(current).wait_stream(_stream(self.stream))
        self.stream = current


_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)


def _stream(named: tuple[int, int, int]) -> torch.cuda.Stream:
    return torch.cuda.Stream(stream_id=named[0], device_index=named[1], device_type=named[2])


_POOLS: dict[object, GraphPool] = {}


def shared_pool(device: torch.device) -> GraphPool:
    """The process's pool for the CUDA device ``device``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    pool = _POOLS.get(index)
    if pool is None:
        with torch.cuda.device(index):
            pool = _POOLS[index] = GraphPool(torch.cuda.graph_pool_handle(), index)
    return pool
