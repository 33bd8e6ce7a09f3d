"""The callable ``wrap`` returns: per input key, a warm-up call, then a recorded graph
replayed at every later call, or the compiled callable itself where a graph is unsafe."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
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
from kiln_cudagraphs.keys import input_key, tensor_pointers
from kiln_cudagraphs.outputs import UnsupportedOutput
from kiln_cudagraphs.stats import PROCESS_TOTALS, CudaGraphStats

log = logging.getLogger("kiln.cudagraphs")

MAX_GRAPHS = 8  # input keys per wrapper; calls with further keys run eagerly


@dataclass(frozen=True)
class WarmedUp:
    """A key seen once: the data pointers its tensor inputs had."""

    pointers: dict[int, int]


@dataclass(frozen=True)
class Eager:
    """A key whose calls run without a graph, and why."""

    reason: str


class CudaGraphRunner:
    """Runs ``compiled`` through CUDA graphs, one per input key (see the package docs).

    The first call of a key runs eagerly (lazy initialisation, autotuning and library
    handles happen outside capture). The second runs eagerly too (its result is returned)
    under torch's sync debug mode: a key whose run synchronises with the host runs eagerly
    from then on, without a capture being attempted. Otherwise it records the graph,
    replays it once on the same inputs and keeps it only if the replay matches the eager
    result; tensor inputs whose data pointer was the same in both calls are read in place,
    the others are copied into static buffers before each replay. Later calls replay; an
    in-place input found elsewhere makes the key record again with that input copied.
    """

    def __init__(
        self,
        compiled: Callable,
        *,
        max_graphs: int = MAX_GRAPHS,
        recorder: Recorder | None = None,
        device_type: str = "cuda",
    ) -> None:
        if max_graphs < 0:
            raise ValueError(f"max_graphs={max_graphs}: give 0 (never record) or more")
        self.compiled = compiled
        self.__wrapped__ = compiled
        self.max_graphs = max_graphs
        self.recorder = recorder if recorder is not None else CudaGraphRecorder()
        self.device_type = device_type
        self.stats = CudaGraphStats()
        self.entries: dict[tuple, WarmedUp | RecordedGraph | Eager] = {}
        self.refusal = host_random_reason(compiled)  # holds for every call
        self._logged: set[str] = set()

    @property
    def num_graphs(self) -> int:
        """Graphs recorded and kept now."""
        return sum(isinstance(e, RecordedGraph) for e in self.entries.values())

    def __call__(self, *inputs: object) -> object:
        reason = self.refusal or call_refusal(inputs, self.device_type)
        if reason is not None:
            return self._run_eagerly(inputs, reason)
        try:
            key = input_key(inputs)
        except TypeError as exc:
            return self._run_eagerly(inputs, str(exc))
        entry = self.entries.get(key)
        if isinstance(entry, RecordedGraph):
            moved = entry.moved_inputs(inputs)
            if not moved:
                self._count("replays")
                return entry(inputs)
            return self._record(key, inputs, entry.copied | set(moved))
        if isinstance(entry, WarmedUp):
            pointers = tensor_pointers(inputs)
            return self._record(
                key, inputs, {i for i in pointers if pointers[i] != entry.pointers[i]}
            )
        if isinstance(entry, Eager):
            return self._run_eagerly(inputs, entry.reason)
        if len(self.entries) >= self.max_graphs:
            return self._run_eagerly(
                inputs,
                f"more than {self.max_graphs} input shapes (max_graphs): further shapes "
                "run without graphs",
            )
        self.entries[key] = WarmedUp(tensor_pointers(inputs))
        self._count("warmups")
        return self.compiled(*inputs)

    # --- the steps ------------------------------------------------------------------

    def _record(self, key: tuple, inputs: Sequence[object], copied: set[int]) -> object:
        """Run eagerly (this call's result) watching for host syncs, record, check one
        replay against it."""
        self.entries.pop(key, None)  # a graph recorded before frees its memory first
        device = _device(inputs)
        expected, host_sync = self.recorder.run_eagerly(lambda: self.compiled(*inputs), device)
        if host_sync is not None:  # no capture is attempted: a failed one harms the process
            return self._give_up(
                key, expected, f"the graph synchronizes with the host ({host_sync})"
            )
        try:
            graph = record(self.compiled, inputs, copied, self.recorder, device)
            replayed = graph(inputs)
        except (CaptureRefused, UnsupportedOutput) as exc:
            return self._give_up(key, expected, str(exc))
        except Exception as exc:  # e.g. a host sync torch does not report while capturing
            return self._give_up(key, expected, f"capture failed: {type(exc).__name__}: {exc}")
        mismatch = describe_mismatch(expected, replayed)
        if mismatch is not None:
            return self._give_up(key, expected, f"the replay is not the eager result: {mismatch}")
        self.entries[key] = graph
        self._count("captures")
        return expected

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
        log.warning("%s runs without CUDA graphs: %s", _describe(self.compiled), reason)


def _device(inputs: Sequence[object]) -> torch.device:
    return next(x.device for x in inputs if isinstance(x, torch.Tensor))


def _describe(compiled: Callable) -> str:
    return getattr(compiled, "__qualname__", None) or type(compiled).__name__
