"""Recording one CUDA graph of a compiled callable, and replaying it.

A recorder does three things: ``run_eagerly(fn, device)`` runs ``fn`` (no arguments: it
calls the compiled callable) and says whether it synchronised with the host (no capture
can hold that), ``recorder(fn, device)`` records it into ``(replay, static_outputs)``, and
``pool(device)`` is the :class:`~kiln_cudagraphs.pool.GraphPool` it records into.
:class:`CudaGraphRecorder` captures into a ``torch.cuda.CUDAGraph`` on a side stream, into
the one pool of the device that every graph of the process shares; the runner takes any
other recorder with the same methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import torch

from kiln_cudagraphs.copies import CopyPlan
from kiln_cudagraphs.outputs import OutputPlan
from kiln_cudagraphs.pool import GraphPool, shared_pool
from kiln_cudagraphs.syncs import run_watching_host_syncs

log = logging.getLogger("kiln.cudagraphs")


class Recorder(Protocol):
    def run_eagerly(
        self, fn: Callable[[], Sequence[object]], device: torch.device
    ) -> tuple[Sequence[object], str | None]:
        """``fn()`` and the first host synchronisation it made (or None)."""
        ...

    def __call__(
        self, fn: Callable[[], Sequence[object]], device: torch.device
    ) -> tuple[Callable[[], None], Sequence[object]]: ...

    def pool(self, device: torch.device) -> GraphPool: ...


class CaptureRefused(Exception):
    """The inputs cannot be given to a graph (the message says why)."""


class CudaGraphRecorder:
    """Runs ``fn`` once on a side stream of the inputs' device, then captures it there, as
    ``torch.cuda.graph`` documents, into the memory pool of the device shared by every
    graph of the process (``pool.py`` says why that is safe)."""

    def __init__(self) -> None:
        self.streams: dict[int, torch.cuda.Stream] = {}

    def pool(self, device: torch.device) -> GraphPool:
        return shared_pool(device)

    def run_eagerly(
        self, fn: Callable[[], Sequence[object]], device: torch.device
    ) -> tuple[Sequence[object], str | None]:
        with torch.cuda.device(_index(device)):
            return run_watching_host_syncs(fn)

    def __call__(
        self, fn: Callable[[], Sequence[object]], device: torch.device
    ) -> tuple[Callable[[], None], Sequence[object]]:
        index = _index(device)
        with torch.cuda.device(index):
            pool = shared_pool(device).handle
            if index not in self.streams:
                self.streams[index] = torch.cuda.Stream()
            stream = self.streams[index]
            # one run on the capture stream first, as torch.cuda.graph's documentation
            # does: library workspaces for this stream are made outside the capture
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    outputs = fn()
            except Exception:
                _close_generator_capture(index, stream)
                shared_pool(device).renew()
                raise

        def replay() -> None:  # on the caller's current stream of the graph's device
            if torch.cuda.current_device() == index:
                graph.replay()
            else:
                with torch.cuda.device(index):
                    graph.replay()

        return replay, outputs


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _close_generator_capture(index: int, stream: torch.cuda.Stream) -> None:
    """After a capture that failed: torch tells the device's CUDA generator that a capture
    ended only when one ends well, so every random op would now raise ("Offset increment
    outside graph capture"). A small capture that ends well, of its own pool, tells it."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
            torch.zeros(1, device=torch.device("cuda", index))
    except Exception as exc:  # the first failure is the one to report
        log.warning("could not end the CUDA generator's capture after a failed one: %s", exc)


class RecordedGraph:
    """One recorded graph: the inputs it reads where they are (``in_place``: index ->
    data pointer), the buffers its copied inputs go to, and how its outputs are handed out.

    Inputs are read in place when they are static (parameters, buffers: the caller says
    which) or outputs of another graph of the pool (a forward graph's results that the
    backward graph reads); every other tensor input is copied into its buffer. Outputs are
    handed out over graph memory, or copied when ``fresh_outputs``."""

    def __init__(
        self,
        replay: Callable[[], None],
        buffers: dict[int, torch.Tensor],
        in_place: dict[int, int],
        outputs: OutputPlan,
        pool: GraphPool,
        fresh_outputs: bool = False,
    ) -> None:
        self.replay = replay
        self.buffers = buffers
        self.in_place = in_place
        self.outputs = outputs
        self.pool = pool
        self._hand_out = outputs.fresh if fresh_outputs else outputs.hand_out
        self._indices = list(in_place)
        self._last_index = max(in_place, default=-1)
        # torch's check reads the pointer of input i at position i: a list as long as the inputs
        width = self._last_index + 1
        self._pointers = [in_place.get(i) for i in range(width)]
        self._copies = (list(buffers.values()), list(buffers))
        self._copy = CopyPlan([b.numel() * b.element_size() for b in buffers.values()])

    @property
    def copied(self) -> frozenset[int]:
        return frozenset(self.buffers)

    def moved_inputs(self, inputs: Sequence[object]) -> list[int]:
        """The in-place inputs whose memory is not where the graph reads it."""
        if len(inputs) <= self._last_index:
            raise RuntimeError(
                f"a CUDA graph recorded reading input {self._last_index} in place was "
                f"called with {len(inputs)} inputs: report this to kiln-cudagraphs"
            )
        if _pointers_equal is not None and _pointers_equal(
            list(inputs), self._pointers, self._indices
        ):
            return []
        return [i for i, ptr in self.in_place.items() if inputs[i].data_ptr() != ptr]

    def owns(self, x: object) -> bool:
        """Whether tensor ``x`` is one of this graph's outputs."""
        return self.pool.owner(x.data_ptr()) is self

    def pool_inputs(self, inputs: Sequence[object]) -> list[int]:
        """The copied inputs that are now outputs of another graph of the pool: a graph
        recorded again would read them where they are."""
        return [
            i
            for i in self.buffers
            if (owner := self.pool.owner(inputs[i].data_ptr())) is not None and owner is not self
        ]

    def __call__(self, inputs: Sequence[object]) -> tuple | list:
        self.pool.order_streams()  # first: the input copies wait for the last replay too
        buffers, indices = self._copies
        if buffers:  # before invalidating: an input may be an output of the last replay
            self._copy(buffers, [inputs[i] for i in indices])
        self.pool.replaying(self)
        self.replay()
        return self._hand_out(inputs)

    # --- as a member of the pool ---------------------------------------------------

    def invalidate_outputs(self) -> None:
        self.outputs.invalidate()

    def outputs_in_use(self) -> bool:
        return self.outputs.in_use()

    def output_pointers(self) -> list[int]:
        return self.outputs.output_pointers()


# One C++ call comparing many data pointers (CUDA builds of torch), else None.
_pointers_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


def record(
    compiled: Callable,
    inputs: Sequence[object],
    in_place: Collection[int],
    recorder: Recorder,
    device: torch.device,
    unused: Collection[int] = (),
    fresh_outputs: bool = False,
    kept_outputs: Collection[int] = (),
) -> RecordedGraph:
    """Record ``compiled`` on ``inputs``: the ``in_place`` tensor inputs are read where
    they are, the other tensor inputs go through static buffers; the ``unused`` ones
    (nothing computes with them) are kept as this call passed them. ``fresh_outputs``:
    every replay returns copies of the outputs (else tensors over graph memory), except
    the ``kept_outputs`` (see ``OutputPlan``)."""
    static = list(inputs)
    buffers = {}
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and i not in in_place and i not in unused:
            static[i] = buffers[i] = _static_buffer(i, x)
    read_in_place = {
        i: x.data_ptr()
        for i, x in enumerate(inputs)
        if isinstance(x, torch.Tensor) and i not in buffers and i not in unused
    }
    replay, static_outputs = recorder(lambda: compiled(*static), device)
    pool = recorder.pool(device)
    plan = OutputPlan(static_outputs, static, kept_outputs if fresh_outputs else ())
    graph = RecordedGraph(replay, buffers, read_in_place, plan, pool, fresh_outputs)
    pool.add(graph)
    return graph


def _static_buffer(index: int, x: torch.Tensor) -> torch.Tensor:
    if not non_overlapping(x):
        raise CaptureRefused(
            f"input {index} has elements that share memory (an expanded tensor) and changes "
            "between calls: no static buffer can hold it"
        )
    buffer = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return buffer.copy_(x)


def non_overlapping(x: torch.Tensor) -> bool:
    """No two elements of ``x`` share memory (what a copy into a buffer of its layout needs)."""
    extent = 1  # elements spanned by the dimensions of smaller stride
    for stride, size in sorted((s, n) for n, s in zip(x.shape, x.stride(), strict=True) if n > 1):
        if stride < extent:
            return False
        extent = stride * (size - 1) + extent
    return True
