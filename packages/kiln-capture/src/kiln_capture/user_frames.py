"""Where a warning points: the user's line that led to it, not Kiln's own code.

Kiln's warnings are raised deep in its packages, in generated dispatchers
(``<kiln dispatch f>``) and beneath torch's module call machinery; ``stacklevel`` counted
from the raising function would point at one of those. :func:`user_stacklevel` counts the
frames up to the first that belongs to none of them: the user's call.

A thread that works for another (a training step's backward compiled while the forward
compiles) has no user frame of its own: it takes the user's line in the thread it works
for (:func:`user_location`, then :func:`pointing_at`), where :func:`warn_user` points its
warnings.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Iterator

# top-level packages whose frames are never the user's
NOT_THE_USERS = frozenset(
    {"kiln", "kiln_capture", "kiln_autograd", "kiln_loopir", "kiln_cpp", "kiln_triton",
     "kiln_cudagraphs", "torch"}
)  # fmt: skip


_this_thread = threading.local()  # location: where a thread working for another points


def _not_the_users(frame) -> bool:
    return (
        str(frame.f_globals.get("__name__", "")).split(".")[0] in NOT_THE_USERS
        or frame.f_code.co_filename.startswith("<kiln")  # a generated dispatcher
    )


def user_location() -> tuple[str, int, dict] | None:
    """``(file, line, module globals)`` of this thread's first frame outside Kiln, torch and
    Kiln's generated code, or the location :func:`pointing_at` gave a thread working for
    another; None where there is neither."""
    given = getattr(_this_thread, "location", None)
    if given is not None:
        return given
    frame = sys._getframe(1)
    while frame is not None and _not_the_users(frame):
        frame = frame.f_back
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals


@contextlib.contextmanager
def pointing_at(location: tuple[str, int, dict] | None) -> Iterator[None]:
    """In this thread, warnings of :func:`warn_user` point at ``location``."""
    before = getattr(_this_thread, "location", None)
    _this_thread.location = location
    try:
        yield
    finally:
        _this_thread.location = before


def warn_user(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` pointing at the user's line that led to it (this thread's, or the
    one :func:`pointing_at` gave a thread working for another)."""
    location = user_location()
    if location is None:
        warnings.warn(message, category, stacklevel=2)
        return
    filename, line, module_globals = location
    registry = module_globals.setdefault("__warningregistry__", {})
    name = module_globals.get("__name__")
    warnings.warn_explicit(message, category, filename, line, name, registry, module_globals)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the function calling this point at
    the first frame outside Kiln, torch and Kiln's generated code."""
    frame, level = sys._getframe(2), 2
    while frame is not None and _not_the_users(frame):
        frame, level = frame.f_back, level + 1
    return level
