"""Kiln's logs: standard ``logging``, one logger per kind of artifact.

``KILN_LOGS=graph,guards,recompiles,graph_breaks,fallbacks,output_code,schedule,perf`` (read at
import) or ``kiln.set_logs("graph,perf")`` switches kinds on: each is the logger
``kiln.<kind>`` at INFO level, printed to stderr. ``progress`` (compile progress of long
compiles) is on by default (``set_logs`` without it switches it off); ``all`` switches
every kind on. Applications that configure ``logging`` themselves can use the loggers
directly instead.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

KINDS = (
    "graph",  # the captured graphs and the aten graphs (forward, backward)
    "guards",  # each captured frame's guard function
    "recompiles",  # why a function was captured again
    "graph_breaks",  # where and why a graph ended early
    "fallbacks",  # ops run as extern ATen calls (no decomposition, no lowering), once each
    "output_code",  # generated kernels and host programs
    "schedule",  # loop IR before and after fusion
    "perf",  # time of each compile stage
    "progress",  # stage and kernel counts while a long compile runs
)
DEFAULT_ON = ("progress",)

_handler: logging.Handler | None = None


def logger(kind: str) -> logging.Logger:
    return logging.getLogger(f"kiln.{kind}")


def _stderr_handler() -> logging.Handler:
    global _handler
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    return _handler


def set_logs(kinds: str | Iterable[str] = (), **switches: bool) -> None:
    """Switch log kinds on (``set_logs("graph,perf")``, ``set_logs(perf=True)``) and the
    others off. Unknown kinds raise ``ValueError`` listing the known ones."""
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    wanted = set(kinds)
    if "all" in wanted:
        wanted = (wanted - {"all"}) | set(KINDS)
    wanted |= {k for k, on in switches.items() if on}
    wanted -= {k for k, on in switches.items() if not on}
    unknown = sorted((wanted | set(switches)) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown Kiln log kind(s) {unknown}; known: {list(KINDS)} or 'all'")
    for kind in KINDS:
        log = logger(kind)
        if kind in wanted:
            log.setLevel(logging.INFO)
            if _stderr_handler() not in log.handlers:
                log.addHandler(_stderr_handler())
            log.propagate = False
        else:
            log.setLevel(logging.WARNING)
            if _stderr_handler() in log.handlers:
                log.removeHandler(_stderr_handler())
            log.propagate = True


def enabled(kind: str) -> bool:
    return logger(kind).isEnabledFor(logging.INFO)


def configure_from_environment() -> None:
    """Apply ``KILN_LOGS`` (at import), on top of the kinds that are on by default."""
    value = os.environ.get("KILN_LOGS", "")
    set_logs([*DEFAULT_ON, *(k.strip() for k in value.split(",") if k.strip())])
