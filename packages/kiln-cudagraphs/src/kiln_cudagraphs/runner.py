"""The callable ``wrap`` returns: per input key, a warm-up call, then a recorded graph
replayed at every later call, or the compiled callable itself where a graph is unsafe."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from kiln_cudagraphs.checks import call_refusal, describe_mismatch, host_random_reason
from kiln_cudagraphs.graph import (
    CaptureRefused,
    CudaGraphRecorder,
    RecordedGraph,
    Recorder,
    record,
)
from kiln_cudagraphs.keys import input_key
from kiln_cudagraphs.outputs import UnsupportedOutput
from kiln_cudagraphs.pool import GraphPool
from kiln_cudagraphs.stats import PROCESS_TOTALS, CudaGraphStats

log = logging.getLogger("kiln.cudagraphs")

MAX_GRAPHS = 8  # input keys per wrapper; a further key evicts the least recently used
MAX_RECORDINGS = 4  # per key: recordings again (an input moved), then the key runs eagerly
# kiln's default mode (fresh outputs), where nobody asked for graphs: a parameter or buffer
# that moved keeps moving (FSDP2 allocates its unsharded parameters anew at every
# all-gather), and recording again (a synchronize, a garbage collection, a checked replay:
# milliseconds) would cost more than many replays save
STATIC_INPUT_MOVED = (
    "input {} (a parameter or buffer read in place) moved: the default mode records a graph "
    "once (mode='reduce-overhead' records again)"
)
KEPT_ALIVE = (
    "saved tensors of an earlier call are still alive (a forward called again before the "
    "backward of the last call ran): the replay would overwrite them"
)


@dataclass(frozen=True)
class WarmedUp:
    """A key whose ``calls`` ran without a graph so far."""

    calls: int = 1


@dataclass(frozen=True)
class Eager:
    """A key whose calls run without a graph, and why."""

    reason: str


class CudaGraphRunner:
    """Runs ``compiled`` through CUDA graphs, one per input key (see the package docs).

    The first call of a key runs eagerly (lazy initialisation, autotuning and library
    handles happen outside capture), and so do its first ``warmups`` calls. The next runs
    eagerly too under torch's sync debug
    mode: a key whose run synchronises with the host runs eagerly from then on, without a
    capture being attempted. Otherwise it records the graph, replays it once on the same
    inputs and keeps it only if the replay matches the eager run. The ``static_inputs``
    (parameters, buffers: indices the caller gives) and inputs that are outputs of another
    graph of the pool are read in place; the others are copied into static buffers before
    each replay. Later calls replay; an in-place input found elsewhere, or a copied input
    found to be another graph's output, makes the key record again.

    ``pinned=True``: the caller guarantees that every call's inputs match in shape,
    stride, dtype and device (capture's guards do), so no key is computed per call.
    ``keyed_inputs``: the caller's guards pin every input but these (a graph with symbolic
    sizes: its inputs of symbolic layout, and its numbers), so the key is read from them
    alone, and what can refuse a graph (devices, autograd) is found once per grad mode.

    ``fresh_outputs=True`` (kiln's default mode): every call returns outputs of its own, as
    the compiled callable does (one copy of the outputs' bytes per replay), and a key that
    runs without a graph is logged at INFO: the compiled callable is the default anyway. A
    key whose outputs take more than ``max_copy_bytes`` runs without a graph: copying them
    would cost more than the replay saves, and a key whose static input moved runs without
    a graph from then on. The ``saved_outputs`` (a forward graph's saved
    tensors, which only its backward reads) are not copied but handed out over graph
    memory; a call that would overwrite ones still alive (a second forward before the
    first one's backward) runs without a graph.
    """

    def __init__(
        self,
        compiled: Callable,
        *,
        max_graphs: int = MAX_GRAPHS,
        recorder: Recorder | None = None,
        device_type: str = "cuda",
        static_inputs: Collection[int] = (),
        unchecked_outputs: Collection[int] = (),
        unused_inputs: Collection[int] = (),
        pinned: bool = False,
        fresh_outputs: bool = False,
        max_copy_bytes: int | None = None,
        saved_outputs: Collection[int] = (),
        warmups: int = 1,
        keyed_inputs: Collection[int] | None = None,
    ) -> None:
        if max_graphs < 0:
            raise ValueError(f"max_graphs={max_graphs}: give 0 (never record) or more")
        if warmups < 1:
            raise ValueError(f"warmups={warmups}: a key runs at least once before it records")
        self.warmups = warmups
        self.compiled = compiled
        self.__wrapped__ = compiled
        self.max_graphs = max_graphs
        self.recorder = recorder if recorder is not None else CudaGraphRecorder()
        self.device_type = device_type
        self._cuda = device_type == "cuda" and torch.cuda.is_available()
        self.static_inputs = frozenset(static_inputs)
        self.unchecked_outputs = frozenset(unchecked_outputs)
        self.unused_inputs = frozenset(unused_inputs)
        self.pinned = pinned
        self.keyed_inputs = None if keyed_inputs is None else tuple(sorted(keyed_inputs))
        self.fresh_outputs = fresh_outputs
        self.max_copy_bytes = max_copy_bytes
        self.saved_outputs = frozenset(saved_outputs)
        self.stats = CudaGraphStats()
        self.entries: dict[tuple, WarmedUp | RecordedGraph | Eager] = {}  # oldest use first
        self.recordings: dict[tuple, int] = {}
        self.refusal = host_random_reason(compiled)  # holds for every call
        self._refusals: dict[bool, str | None] = {}  # pinned: per grad mode
        self._logged: set[str] = set()

    @property
    def num_graphs(self) -> int:
        """Graphs recorded and kept now."""
        return sum(isinstance(e, RecordedGraph) for e in self.entries.values())

    def __call__(self, *inputs: object) -> object:
        if self._cuda and torch.cuda.is_current_stream_capturing():
            return self.compiled(*inputs)  # the caller's own capture records the kernels
        reason = self.refusal or self._call_refusal(inputs)
        if reason is not None:
            return self._run_eagerly(inputs, reason)
        if self.pinned:
            key = (len(inputs),)  # the caller's guards pin the rest
        else:
            try:
                key = input_key(inputs, self.keyed_inputs)
            except TypeError as exc:
                return self._run_eagerly(inputs, str(exc))
        entry = self.entries.get(key)
        if entry is not None and not self.pinned:  # the most recently used key goes last
            self.entries[key] = self.entries.pop(key)
        if isinstance(entry, RecordedGraph):
            if self.fresh_outputs and entry.pool.overwrites_live_outputs(entry):
                return self._run_eagerly(inputs, KEPT_ALIVE)
            moved = entry.moved_inputs(inputs)
            now_in_pool = entry.pool_inputs(inputs)
            if not moved and not now_in_pool:
                self._count("replays")
                return entry(inputs)
            return self._record_again(key, inputs, entry, moved, now_in_pool)
        if isinstance(entry, WarmedUp):
            if entry.calls < self.warmups:
                self.entries[key] = WarmedUp(entry.calls + 1)
                self._count("warmups")
                return self.compiled(*inputs)
            return self._record(key, inputs)
        if isinstance(entry, Eager):
            return self._run_eagerly(inputs, entry.reason)
        if len(self.entries) >= self.max_graphs and not self._evict_least_recently_used():
            return self._run_eagerly(
                inputs,
                f"more than {self.max_graphs} input shapes (max_graphs) whose graphs' "
                "outputs are all still in use: further shapes run without graphs",
            )
        self.entries[key] = WarmedUp()
        self._count("warmups")
        return self.compiled(*inputs)

    def _evict_least_recently_used(self) -> bool:
        """Drop the key used longest ago whose graph may go (one whose outputs handed out
        over its memory are dead, or that has no graph): its memory returns to the pool.
        False when every key's graph still has outputs in use."""
        for key, entry in self.entries.items():
            if isinstance(entry, RecordedGraph):
                if self.fresh_outputs and entry.outputs_in_use():
                    continue
                entry.pool.remove(entry)
            del self.entries[key]
            self.recordings.pop(key, None)
            self._count("evictions")
            return True
        return False

    def _call_refusal(self, inputs: Sequence[object]) -> str | None:
        if not self.pinned and self.keyed_inputs is None:
            return call_refusal(inputs, self.device_type, self.unused_inputs)
        grad = torch.is_grad_enabled()
        if grad not in self._refusals:
            self._refusals[grad] = call_refusal(inputs, self.device_type, self.unused_inputs)
        return self._refusals[grad]

    # --- the steps ------------------------------------------------------------------

    def _record_again(
        self,
        key: tuple,
        inputs: Sequence[object],
        graph: RecordedGraph,
        moved: list[int],
        now_in_pool: list[int],
    ) -> object:
        """A static input moved (a parameter replaced: read at its new place), an input
        read from another graph left it (copied from now on), or a copied input is now
        another graph's output (read in place from now on)."""
        moved_static = [i for i in moved if i in self.static_inputs]
        if self.fresh_outputs and moved_static:
            return self._drop(key, graph, inputs, STATIC_INPUT_MOVED.format(moved_static[0]))
        in_place = (set(graph.in_place) - set(moved)) | set(now_in_pool)
        in_place |= set(moved_static)
        self.recordings[key] = self.recordings.get(key, 0) + 1
        if self.recordings[key] > MAX_RECORDINGS:
            return self._drop(
                key,
                graph,
                inputs,
                f"inputs read in place moved {MAX_RECORDINGS} times: the graph would be "
                "recorded at every call",
            )
        return self._record(key, inputs, in_place)

    def _drop(self, key: tuple, graph: RecordedGraph, inputs: Sequence[object], reason: str):
        """Drop ``key``'s graph: this call and the later ones of the key run eagerly."""
        self.entries.pop(key)
        graph.pool.remove(graph)
        return self._give_up(key, self.compiled(*inputs), reason)

    def _in_place(self, inputs: Sequence[object], pool: GraphPool) -> set[int]:
        """Static inputs, and inputs that are outputs of a graph of the pool."""
        return {
            i
            for i, x in enumerate(inputs)
            if isinstance(x, torch.Tensor)
            and i not in self.unused_inputs
            and (i in self.static_inputs or pool.owner(x.data_ptr()) is not None)
        }

    def _record(
        self, key: tuple, inputs: Sequence[object], in_place: set[int] | None = None
    ) -> object:
        """Run eagerly watching for host syncs, record, check one replay against the eager
        run; the replay's outputs are this call's result. A graph recorded before for the
        key is dropped once the new one is recorded (inputs that are its outputs are
        copied, not read in place)."""
        device = _device(inputs)
        pool = self.recorder.pool(device)
        old = self.entries.pop(key, None)
        if in_place is None:
            in_place = self._in_place(inputs, pool)
        if isinstance(old, RecordedGraph):
            in_place = {i for i in in_place if i in self.static_inputs or not old.owns(inputs[i])}
        try:
            return self._record_new(key, inputs, in_place, device, pool)
        finally:
            if isinstance(old, RecordedGraph):
                pool.remove(old)

    def _record_new(
        self,
        key: tuple,
        inputs: Sequence[object],
        in_place: set[int],
        device: torch.device,
        pool: GraphPool,
    ) -> object:
        rng = _device_rng_state(device)  # the replay checked below draws as the eager run did
        expected, host_sync = self.recorder.run_eagerly(lambda: self.compiled(*inputs), device)
        if host_sync is not None:  # no capture is attempted: a failed one harms the process
            return self._give_up(
                key, expected, f"the graph synchronizes with the host ({host_sync})"
            )
        graph = None
        try:
            graph = record(
                self.compiled,
                inputs,
                in_place,
                self.recorder,
                device,
                self.unused_inputs,
                self.fresh_outputs,
                self.saved_outputs,
            )
            self._check_copy(graph)
            _set_device_rng_state(device, rng)
            replayed = graph(inputs)
            mismatch = describe_mismatch(
                expected, replayed, graph.outputs.placements, self.unchecked_outputs
            )
        except (CaptureRefused, UnsupportedOutput) as exc:
            mismatch, reason = None, str(exc)
        except Exception as exc:  # e.g. a host sync torch does not report while capturing
            mismatch, reason = None, f"capture failed: {type(exc).__name__}: {exc}"
        else:
            if mismatch is None:
                self.entries[key] = graph
                self._count("captures")
                return replayed
            reason = f"the replay is not the eager result: {mismatch}"
        if graph is not None:
            pool.remove(graph)
        return self._give_up(key, expected, reason)

    def _check_copy(self, graph: RecordedGraph) -> None:
        """With fresh outputs, a graph whose outputs take longer to copy than its replay
        saves is refused (``max_copy_bytes``)."""
        limit = self.max_copy_bytes
        if not self.fresh_outputs or limit is None:
            return
        nbytes = graph.outputs.copy_bytes
        if nbytes > limit:
            raise CaptureRefused(
                f"its outputs take {nbytes} bytes, more than copying them at every call "
                f"would save ({limit} bytes)"
            )

    def _give_up(self, key: tuple, expected: object, reason: str) -> object:
        self.entries[key] = Eager(reason)
        self._count("failed_captures")
        self._log_once(reason)
        return expected

    def _run_eagerly(self, inputs: Sequence[object], reason: str) -> object:
        self.stats.count_eager(reason)
        PROCESS_TOTALS.count_eager(reason)
        self._log_once(reason)
        return self.compiled(*inputs)

    def _count(self, name: str) -> None:
        setattr(self.stats, name, getattr(self.stats, name) + 1)
        setattr(PROCESS_TOTALS, name, getattr(PROCESS_TOTALS, name) + 1)

    def _log_once(self, reason: str) -> None:
        if reason in self._logged:
            return
        self._logged.add(reason)
        level = logging.INFO if self.fresh_outputs else logging.WARNING
        log.log(level, "%s runs without CUDA graphs: %s", _describe(self.compiled), reason)


def _device(inputs: Sequence[object]) -> torch.device:
    return next(x.device for x in inputs if isinstance(x, torch.Tensor))


def _describe(compiled: Callable) -> str:
    return getattr(compiled, "__qualname__", None) or type(compiled).__name__


def _device_rng_state(device: torch.device) -> torch.Tensor | None:
    """The state of ``device``'s default generator (CUDA), which random numbers drawn on
    the device in a graph come from: a replay started from the state the eager run started
    from draws the same numbers (and leaves the generator as that run left it)."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_device_rng_state(device: torch.device, state: torch.Tensor | None) -> None:
    if state is not None:
        torch.cuda.set_rng_state(state, device)
