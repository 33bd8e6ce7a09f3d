"""CUDA-graph runtime: ``kiln.compile(..., mode="reduce-overhead")`` replays compiled graphs.

kiln-cudagraphs registers this module in the ``kiln.runtime`` entry-point group as
``cudagraphs``: ``device_types`` names the devices it serves and ``wrap(compiled,
example_inputs)`` returns a callable that runs ``compiled`` (``compiled(*inputs)`` returns
a flat tuple or list) through one CUDA graph per input key. Each key is warmed up eagerly,
recorded on a side stream into the memory pool every graph of the device shares, checked
once against eager, then replayed; outputs are handed out over the graph's memory and
raise once a later replay has overwritten them (clone what you keep), or, with
``fresh_outputs`` (kiln's default mode), copied into memory of their own. Where a graph would be
wrong (inputs off the GPU, inputs requiring grad under grad mode, random seeds drawn on
the host, a call that synchronises with the host, a capture that fails or differs from
eager, too many keys) the call runs
``compiled`` itself and the ``kiln.cudagraphs`` logger says why, once. A call made while
the caller's own CUDA graph is being captured runs ``compiled`` itself, into that capture;
a replay on another stream than the last replay's waits for that stream's work first.

``stats(wrapped)`` reports what a wrapper did; ``stats()`` totals the process.
``register_view_maker(factory)`` lets a caller make the tensors a replay hands out in one
native call (Kiln registers kiln-cpp's ``TensorsOn``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from kiln_cudagraphs.__about__ import __version__
from kiln_cudagraphs.outputs import register_view_maker
from kiln_cudagraphs.runner import MAX_GRAPHS, CudaGraphRunner
from kiln_cudagraphs.stats import PROCESS_TOTALS, CudaGraphStats

__all__ = [
    "MAX_GRAPHS",
    "CudaGraphRunner",
    "CudaGraphStats",
    "__version__",
    "device_types",
    "register_view_maker",
    "stats",
    "wrap",
]

device_types = ("cuda",)


def wrap(
    compiled: Callable,
    example_inputs: Sequence[object],
    *,
    static_inputs: Collection[int] = (),
    unchecked_outputs: Collection[int] = (),
    unused_inputs: Collection[int] = (),
    pinned: bool = False,
    max_graphs: int = MAX_GRAPHS,
    fresh_outputs: bool = False,
    max_copy_bytes: int | None = None,
    saved_outputs: Collection[int] = (),
    warmups: int = 1,
    keyed_inputs: Collection[int] | None = None,
) -> CudaGraphRunner:
    """``compiled`` replayed through CUDA graphs: the ``kiln.runtime`` contract.

    ``static_inputs``: indices of the inputs that are parameters, buffers or constants
    (kiln-autograd's metadata says which): read in place, never copied. ``pinned``: every
    call's inputs match ``example_inputs`` in shape, stride, dtype and device (the caller
    guards them), so no key is computed per call; ``keyed_inputs``: the guards pin every
    input but these (symbolic sizes), which alone make the key. ``example_inputs`` are otherwise
    accepted as the contract gives them; graphs are recorded from the real inputs of the
    calls. ``unchecked_outputs``: outputs whose values differ between runs (fused
    attention's random-number seed and offset), left out of the check of a recording
    against eager. ``unused_inputs``: inputs nothing computes with (fused attention's seed
    and offset without dropout: new CPU tensors at every call), neither checked, copied nor
    read in place: the graph keeps those of the call it was recorded from. At most
    ``max_graphs`` input keys get a graph. ``fresh_outputs``: every call returns outputs of
    its own (copied after the replay), as kiln's default mode needs, instead of tensors
    over graph memory that the next replay overwrites; with it, a graph whose outputs take
    more than ``max_copy_bytes`` is not kept (the copy would cost more than it saves).
    ``saved_outputs`` (kiln-autograd's ``saved_outputs(gm)``: a forward graph's saved
    tensors) are not copied with ``fresh_outputs``: they are handed out over graph memory,
    and a call that would overwrite ones still alive runs without a graph. ``warmups``:
    calls of a key that run without a graph before the next one records it (1: the
    second call records; more for a caller whose keys are sizes that may never come back).
    """
    return CudaGraphRunner(
        compiled,
        max_graphs=max_graphs,
        static_inputs=static_inputs,
        unchecked_outputs=unchecked_outputs,
        unused_inputs=unused_inputs,
        pinned=pinned,
        fresh_outputs=fresh_outputs,
        max_copy_bytes=max_copy_bytes,
        saved_outputs=saved_outputs,
        warmups=warmups,
        keyed_inputs=keyed_inputs,
    )


def stats(wrapped: CudaGraphRunner | None = None) -> CudaGraphStats:
    """A copy of the counters of ``wrapped`` (a callable ``wrap`` returned), or of every
    wrapper of this process when it is None."""
    if wrapped is None:
        return PROCESS_TOTALS.snapshot()
    if not isinstance(wrapped, CudaGraphRunner):
        raise TypeError(
            f"stats() takes a callable returned by kiln_cudagraphs.wrap, not "
            f"{type(wrapped).__name__}; call stats() without an argument for the totals"
        )
    return wrapped.stats.snapshot()
