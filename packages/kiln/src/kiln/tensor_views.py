"""The tensors a CUDA-graph replay hands out, made in one C++ call: kiln-cpp's host runtime
builds a new tensor over a storage for each of a graph's outputs (``TensorsOn``), where
kiln-cudagraphs' Python reference makes each with ``torch.empty(0).set_(...)``. Registered
with the ``kiln.runtime`` plug-in when it offers ``register_view_maker``; where the runtime
cannot be built (no C++ compiler) the reference runs."""

from __future__ import annotations

import logging

log = logging.getLogger("kiln.runtime")


def native_view_maker(specs: list[tuple]):
    """kiln-cpp's ``TensorsOn(specs)``, or None where its runtime is unavailable."""
    try:
        from kiln_cpp.host import load_runtime

        runtime = load_runtime()
    except Exception as exc:  # noqa: BLE001 - no compiler or headers: the reference runs
        log.info(
            "CUDA-graph outputs made in Python: kiln-cpp's host runtime is unavailable (%s)", exc
        )
        return None
    return runtime.TensorsOn(specs)


def register_with(plugin: object) -> None:
    """Offer :func:`native_view_maker` to a runtime plug-in that takes one."""
    register = getattr(plugin, "register_view_maker", None)
    if callable(register):
        register(native_view_maker)
