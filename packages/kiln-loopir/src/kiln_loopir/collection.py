"""Automatic garbage collection paused while a graph compiles.

A compile makes many objects that live until it ends (nodes, fake tensors, sympy
expressions, traces), so Python's collector keeps running full collections, each over
every object of the process: a third of the fusion stage of a 12-layer BERT went to them.
Reference counting still frees what the compile drops; cycles wait for the next
collection after it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic collection inside (a decorator too). Where collection is already off
    (a caller's pause, or the user's ``gc.disable()``) it stays as it is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
