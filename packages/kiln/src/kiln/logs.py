"""Kiln's logs: standard ``logging``, one logger per kind of artifact.

``KILN_LOGS=graph,guards,recompiles,graph_breaks,fallbacks,output_code,schedule,perf`` (read at
import) or ``kiln.set_logs("graph,perf")`` switches kinds on: each is the logger
``kiln.<kind>`` at INFO level, printed to stderr. ``progress`` (compile progress of long
compiles) is on by default (``set_logs`` without it switches it off, as does
``KILN_LOGS=-progress``); ``all`` switches every kind on, ``+kind`` is ``kind`` and
``-kind`` switches one off (``all,-progress``), as ``TORCH_LOGS`` writes them. An unknown
kind in ``KILN_LOGS`` is ignored with a warning; ``set_logs`` raises for one. Applications
that configure ``logging`` themselves can use the loggers directly instead.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
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


def parse_kinds(kinds: str | Iterable[str]) -> tuple[set[str], set[str]]:
    """(kinds switched on, kinds switched off) of ``"graph,+perf,-progress"`` or a list of
    such names: ``+kind`` is ``kind``, ``-kind`` switches it off, ``all`` is every kind (as
    ``TORCH_LOGS`` writes them)."""
    if isinstance(kinds, str):
        kinds = kinds.split(",")
    on: set[str] = set()
    off: set[str] = set()
    for item in (k.strip() for k in kinds):
        name = item.lstrip("+-")
        if name:
            (off if item.startswith("-") else on).update(KINDS if name == "all" else {name})
    return on, off


def _unknown(kinds: set[str]) -> str:
    return (
        f"unknown Kiln log kind(s) {sorted(kinds - set(KINDS))}; known: {list(KINDS)} or "
        "'all' (+kind or kind switches one on, -kind off)"
    )


def set_logs(kinds: str | Iterable[str] = (), **switches: bool) -> None:
    """Switch log kinds on (``set_logs("graph,perf")``, ``set_logs(perf=True)``,
    ``set_logs("all,-progress")``) and the others off. Unknown kinds raise ``ValueError``
    listing the known ones."""
    on, off = parse_kinds(kinds)
    on |= {k for k, wanted in switches.items() if wanted}
    off |= {k for k, wanted in switches.items() if not wanted}
    if (on | off) - set(KINDS):
        raise ValueError(_unknown(on | off))
    _switch(on - off)


def _switch(wanted: set[str]) -> None:
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
    """Apply ``KILN_LOGS`` (at import), on top of the kinds that are on by default
    (``KILN_LOGS=-progress`` switches one off). Unknown kinds are ignored with one warning
    that lists the known ones: a misspelt log switch must not stop ``import kiln``."""
    on, off = parse_kinds([*DEFAULT_ON, *os.environ.get("KILN_LOGS", "").split(",")])
    if (on | off) - set(KINDS):
        warnings.warn(f"KILN_LOGS: {_unknown(on | off)}; ignored", RuntimeWarning, stacklevel=2)
    _switch((on - off) & set(KINDS))
