"""CUDA graphs through a runtime plug-in (``kiln.runtime`` entry points).

A runtime plug-in is an object with ``device_types`` (the ``torch.device`` types it
serves) and ``wrap(compiled, example_inputs, *, static_inputs, unchecked_outputs,
unused_inputs, pinned, fresh_outputs, keyed_inputs, ...)``, which returns a callable
that replays ``compiled`` as graphs. ``static_inputs`` are the indices of the inputs that are module
state (kiln-autograd's metadata); ``unchecked_outputs`` the outputs whose values differ
between runs (fused attention's random-number seed and offset); ``pinned`` says that every
call's inputs match the example inputs' sizes and strides (no symbolic sizes: the caller's
guards pin them), ``keyed_inputs`` which inputs the guards leave free where some are
(symbolic sizes); ``fresh_outputs`` that every call must return outputs of its own.

- ``mode="reduce-overhead"`` (``options.cudagraphs`` True) replays every graph, its outputs
  handed out over graph memory. Where no loaded plug-in serves the graph's device (on the
  CPU: kiln-cudagraphs serves CUDA devices), the graph launches its kernels one by one and
  Kiln warns once per device and reason.
- The default mode (``options.cudagraphs`` None) replays a CUDA graph of
  :data:`MIN_GRAPH_STEPS` kernels and extern calls or more, with fresh outputs at every
  call: one replay costs the host less than launching that many kernels (a forward
  graph's saved tensors are not copied: only its backward reads them). Smaller graphs,
  graphs whose outputs take more than :data:`COPY_BYTES_PER_STEP` per step to copy, other
  devices and a missing plug-in launch kernel by kernel, logged at INFO.
- ``options={"cudagraphs": False}`` always launches kernel by kernel.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import torch

from kiln import tensor_views
from kiln._plugins import RUNTIME_GROUP, load_plugins
from kiln_capture.user_frames import warn_user

MIN_GRAPH_STEPS = 8  # kernels and extern calls from which the default mode replays a graph
# the most output bytes per step the default mode copies after a replay: a launch costs
# the host about 5 µs, and a copy (each byte read and written) moves about 1.5 MB per µs on
# a current GPU, so the copy takes at most about half the host time the replay saves
COPY_BYTES_PER_STEP = 4 * 1024 * 1024
# calls of one size of a graph of symbolic sizes that run without a graph before the next
# records one: a decode loop meets each length once per generate() call, and recording
# (a capture, a checked replay: milliseconds) pays off only for a size that keeps coming
SIZE_WARMUPS = 3

log = logging.getLogger("kiln.runtime")
_warned: set[str] = set()
_lock = threading.Lock()


def reset_warnings() -> None:
    with _lock:
        _warned.clear()


def _warn_once(message: str) -> None:
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    warn_user(message)


def find_runtime(device_type: str) -> tuple[object | None, str]:
    """The runtime plug-in serving ``device_type``, or None and why there is none."""
    reasons = []
    for plugin in load_plugins(RUNTIME_GROUP):
        if not plugin.loaded:
            reasons.append(f"{plugin.name} failed to load: {plugin.error}")
            continue
        served = tuple(getattr(plugin.obj, "device_types", ()))
        if not callable(getattr(plugin.obj, "wrap", None)):
            reasons.append(f"{plugin.name} ({plugin.distribution}) provides no wrap() yet")
            continue
        if device_type not in served:
            reasons.append(f"{plugin.name} serves {list(served)}, not {device_type!r}")
            continue
        return plugin.obj, ""
    return None, "; ".join(reasons) or "no kiln.runtime plug-in is installed"


def _free_inputs(example_inputs: Sequence[object]) -> list[int]:
    """The inputs whose layout or value a graph's guards leave free: its numbers (sizes)
    and its tensors of symbolic size or stride."""
    return [i for i, x in enumerate(example_inputs) if _free(x)]


def _free(x: object) -> bool:
    if isinstance(x, torch.SymInt | torch.SymFloat):
        return True
    return isinstance(x, torch.Tensor) and any(
        isinstance(n, torch.SymInt) for n in (*x.shape, *x.stride())
    )


def wrap_for_mode(
    compiled: Callable,
    example_inputs: Sequence[object],
    options,
    device: torch.device,
    static_inputs: Sequence[int] = (),
    unchecked_outputs: Sequence[int] = (),
    unused_inputs: Sequence[int] = (),
    steps: int = 0,
    saved_outputs: Sequence[int] = (),
) -> Callable:
    """``compiled`` as the mode runs it: replayed through CUDA graphs, or itself. ``steps``:
    the graph's kernels and extern calls."""
    if options.cudagraphs is False:
        return compiled
    asked = options.cudagraphs is True  # mode="reduce-overhead"
    if not asked and (device.type != "cuda" or steps < MIN_GRAPH_STEPS):
        return compiled
    if asked and device.type != "cuda":
        _warn_once(
            f"kiln: mode='reduce-overhead' replays CUDA graphs, and this graph runs on "
            f"{device.type!r}: it runs in the default mode"
        )
        return compiled
    plugin, reason = find_runtime(device.type)
    if plugin is None:
        if asked:
            _warn_once(
                f"kiln: mode='reduce-overhead' needs a working kiln.runtime plug-in for "
                f"{device.type!r} ({reason}): graphs run in the default mode"
            )
        else:
            log.info("graphs launch their kernels one by one: %s", reason)
        return compiled
    if not asked:
        log.info("a graph of %d steps replays as a CUDA graph with fresh outputs", steps)
    tensor_views.register_with(plugin)
    free = _free_inputs(example_inputs)  # what the guards leave free: symbolic sizes
    return plugin.wrap(
        compiled,
        list(example_inputs),
        static_inputs=tuple(static_inputs),
        unchecked_outputs=tuple(unchecked_outputs),
        unused_inputs=tuple(unused_inputs),
        pinned=not free,
        fresh_outputs=not asked,
        max_copy_bytes=None if asked else steps * COPY_BYTES_PER_STEP,
        saved_outputs=tuple(saved_outputs),
        warmups=SIZE_WARMUPS if free and not asked else 1,
        keyed_inputs=free or None,
    )
