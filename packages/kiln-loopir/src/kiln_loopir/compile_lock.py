"""One compile at a time does its work; another goes on while the first waits.

Compiling a graph is mostly Python work on state that is not made for two threads at once
(a fake tensor mode shared by a training step's forward and backward graphs, a shape
environment, ``make_fx``'s tracer), broken by waits on what runs outside the interpreter:
compile worker processes, a C++ compiler. Two compiles in two threads (a training step's
backward compiled while its forward compiles) take turns: each holds the lock while it
works (:func:`compiling`) and lets it go while it waits (:func:`waiting`), so that one's
waits overlap the other's work and nothing else runs at once. Work on the device happens
while the lock is held: the two compiles never time, capture or launch at the same time.

Code inside :func:`waiting` takes no lock that a compile holding this one could wait for
while it waits itself (it takes its own locks and lets them go before it returns).

A compile that starts another in a thread may give it the first turn (:func:`first_turn`):
a training step's backward graph, whose kernels take the longest to build, then reaches
its first wait first, and the forward's work overlaps that wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_held = threading.local()  # depth: how many compiling() blocks this thread is inside


@contextlib.contextmanager
def compiling(handed_over: threading.Event | None = None) -> Iterator[None]:
    """Hold the lock (again, in a thread holding it already) for the block; ``handed_over``
    (for the outermost block) is set whenever this thread lets the lock go: at its first
    wait, or at the end of the block."""
    depth = getattr(_held, "depth", 0)
    if depth == 0:
        _lock.acquire()
        _held.handed_over = handed_over
    _held.depth = depth + 1
    try:
        yield
    finally:
        _held.depth = depth
        if depth == 0:
            _lock.release()
            _tell_handed_over()
            _held.handed_over = None


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Let the lock go for the block, where this thread holds it, and take it back."""
    depth = getattr(_held, "depth", 0)
    if depth == 0:
        yield
        return
    _held.depth = 0
    _lock.release()
    _tell_handed_over()
    try:
        yield
    finally:
        _lock.acquire()
        _held.depth = depth


def _tell_handed_over() -> None:
    event = getattr(_held, "handed_over", None)
    if event is not None:
        event.set()


def first_turn(handed_over: threading.Event) -> None:
    """Let the lock go until the compile of another thread has taken it and let it go
    (it sets ``handed_over``, given to its :func:`compiling`, then or when it ends without
    it), then take it back: that compile works first, and this one while it waits."""
    with waiting():
        handed_over.wait()
