"""Modes that need a runtime plug-in (``kiln.runtime`` entry points).

``mode="reduce-overhead"`` replays each compiled graph through a runtime plug-in: an
object with ``device_types`` (the ``torch.device`` types it serves) and
``wrap(compiled, example_inputs, *, static_inputs, unchecked_outputs, pinned)``, which
returns a callable. ``static_inputs`` are the indices of the inputs that are module state
(kiln-autograd's metadata); ``unchecked_outputs`` the outputs whose values differ between
runs (fused attention's random-number seed and offset); ``pinned`` says that every call's
inputs match the example inputs' sizes and strides (no symbolic sizes: the caller's guards
pin them). Where no loaded plug-in serves the graph's device (on the CPU: kiln-cudagraphs
serves CUDA devices), the graph runs in the default mode and Kiln warns once per device
and reason.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence

import torch

from kiln._plugins import RUNTIME_GROUP, load_plugins

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
    warnings.warn(message, RuntimeWarning, stacklevel=4)


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


def _symbolic(example_inputs: Sequence[object]) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.SymInt | torch.SymFloat):
            return True
        if isinstance(x, torch.Tensor) and any(
            isinstance(n, torch.SymInt) for n in (*x.shape, *x.stride())
        ):
            return True
    return False


def wrap_for_mode(
    compiled: Callable,
    example_inputs: Sequence[object],
    options,
    device: torch.device,
    static_inputs: Sequence[int] = (),
    unchecked_outputs: Sequence[int] = (),
    unused_inputs: Sequence[int] = (),
) -> Callable:
    if not options.cudagraphs:
        return compiled
    if device.type != "cuda":
        _warn_once(
            f"kiln: mode='reduce-overhead' replays CUDA graphs, and this graph runs on "
            f"{device.type!r}: it runs in the default mode"
        )
        return compiled
    plugin, reason = find_runtime(device.type)
    if plugin is None:
        _warn_once(
            f"kiln: mode='reduce-overhead' needs a working kiln.runtime plug-in for "
            f"{device.type!r} ({reason}): graphs run in the default mode"
        )
        return compiled
    return plugin.wrap(
        compiled,
        list(example_inputs),
        static_inputs=tuple(static_inputs),
        unchecked_outputs=tuple(unchecked_outputs),
        unused_inputs=tuple(unused_inputs),
        pinned=not _symbolic(example_inputs),
    )
