"""Fallback ops: aten ops with neither a place in the op set nor a decomposition.

Such an op stays whole in the graph, as an extern call: a code generator runs it through
ATen (kiln-loopir does), the rest of the graph compiled around it. In a joint graph its
backward is torch's own derivative formula for the op, traced like any other: autograd
differentiates the op before the decomposition table sees it. Each op is logged once per
process on the ``kiln.fallbacks`` logger (``KILN_LOGS=fallbacks`` in Kiln).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("kiln.fallbacks")
_LOGGED: set[str] = set()


def is_fallback_op(target: object) -> bool:
    """Whether ``target`` may stay in a graph as an extern call: an aten op that does not
    write into its inputs (a view op is functional too: functionalization replays it)."""
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable


def note_fallback(target: torch._ops.OpOverload, what: str) -> None:
    """Log, the first time per op, that ``target`` stays in ``what`` as an extern call."""
    name = str(target)
    if name in _LOGGED:
        return
    _LOGGED.add(name)
    log.info(
        "%s has no decomposition and is outside the op set: the %s keeps it whole as an "
        "extern call (ATen's kernel; its backward is torch's formula for it)",
        name,
        what,
    )


def logged_fallbacks() -> list[str]:
    """The ops kept as extern calls in this process so far, sorted."""
    return sorted(_LOGGED)
