"""Fewer garbage-collector passes while Kiln compiles.

A compile allocates a great many short-lived objects (fx nodes, fake tensors, sympy
expressions, loop IR), and each of CPython's full collections walks every object the
process holds: the model, torch, the libraries and their caches. On BERT-base's training
graphs, kiln-loopir's stages spent a quarter of their time in collections (2.47 s, against
1.82-1.93 s with the collector off). While a compile runs, :func:`collecting_less` freezes
the objects that exist when it starts (``gc.freeze``: no collection walks them) and raises
the thresholds (a young collection every :data:`YOUNG` allocations), which brings that
back to 1.83-1.89 s and still collects what the compile drops. Both are undone when the
last compile running ends. A process that froze objects itself, or turned the collector
off, is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
import threading

YOUNG = 20_000  # allocations between young collections while compiling (CPython: 700)
OLDER = 20  # collections of a generation between those of the next (CPython: 10)

_lock = threading.Lock()
_running = 0  # compiles running now (a backward compiled ahead runs beside its forward)
_saved: tuple[tuple[int, ...], bool] | None = None  # thresholds, whether this froze


@contextlib.contextmanager
def collecting_less():
    """Collect less while the block runs (see the module's docstring)."""
    _begin()
    try:
        yield
    finally:
        _end()


def _begin() -> None:
    global _running, _saved
    with _lock:
        _running += 1
        if _running > 1 or not gc.isenabled():
            return
        thresholds = gc.get_threshold()
        froze = gc.get_freeze_count() == 0  # not where the process froze objects itself
        if froze:
            gc.freeze()
        young, *older = thresholds
        gc.set_threshold(max(young, YOUNG), *(max(t, OLDER) for t in older))
        _saved = (thresholds, froze)


def _end() -> None:
    global _running, _saved
    with _lock:
        _running -= 1
        if _running > 0 or _saved is None:
            return
        thresholds, froze = _saved
        _saved = None
        gc.set_threshold(*thresholds)
        if froze:
            gc.unfreeze()
