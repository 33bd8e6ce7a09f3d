"""Exceptions of kiln-capture.

``Unsupported`` is public: ``fullgraph=True`` raises it where a graph would break. The
others steer the interpreter and never reach the user.
"""

from __future__ import annotations


class Unsupported(RuntimeError):
    """A construct that cannot be captured into a graph, with where it happened."""

    def __init__(self, reason: str, where: str = ""):
        self.reason = reason
        self.where = where
        super().__init__(f"{reason} (at {where})" if where else reason)


class GraphBreak(Exception):
    """Raised by an opcode handler: this instruction must run natively. ``data_dependent``:
    because what it makes depends on a tensor's values (an output size, a Python number)."""

    def __init__(self, reason: str, data_dependent: bool = False):
        self.reason = reason
        self.data_dependent = data_dependent
        self.inner_where: str | None = None  # the innermost inlined line where it happened
        super().__init__(reason)


class CaptureFailed(Exception):
    """The whole frame cannot be captured; it runs eagerly (logged, never wrong)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class UserError(Exception):
    """The user's code raised while being traced; the eager run will raise it again."""

    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(f"{type(exc).__name__}: {exc}")


class RestartAnalysis(Exception):
    """Trace the frame again, stopping cleanly before the instruction that breaks."""

    def __init__(self, break_at: int, reason: str, where: str, data_dependent: bool = False):
        self.break_at = break_at
        self.reason = reason
        self.where = where
        self.data_dependent = data_dependent
        super().__init__(reason)
