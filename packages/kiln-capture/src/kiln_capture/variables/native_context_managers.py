"""torch's profiler context managers, entered and left natively, never traced.

``record_function``, ``torch.autograd.profiler.profile``, ``torch.profiler.profile``,
``emit_itt`` and ``emit_nvtx`` hold C handles (``record_function``'s ScriptObject) and the
profiler's global state, and the range they record is only right if it is the real one,
around the compiled graphs inside the block. Capture breaks the graph at their ``with``
statement: the context manager is made and entered for real, the block continues in a
resume function (captured in turn), and that function's call of the bound ``__exit__``
runs natively too. Any other use of such an object (an attribute, a method) also runs
natively, so none of torch's profiler code is traced or captured as a function of its own.

An autocast region made outside the trace is one too (``builder.wrap``): the real region a
graph break inside a ``with torch.autocast`` block enters again after its graph
(``AutocastVariable.reconstruct_exit``), whose bound ``__exit__`` the resume function holds,
and any autocast object a frame reads from outside (an argument, an attribute).
"""

from __future__ import annotations

import functools

import torch

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import MethodVariable, Variable

# ContextDecorator's wrapper asks for the context manager again, which gives itself back
RETURNS_SELF = ("_recreate_cm",)


@functools.cache
def native_context_manager_classes() -> tuple[type, ...]:
    from torch.autograd import profiler

    return (
        profiler.record_function,
        profiler.profile,
        profiler.emit_itt,
        profiler.emit_nvtx,
        torch.profiler.profile,
    )


def is_native_context_manager(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, native_context_manager_classes())


class NativeContextManagerVariable(Variable):
    """A profiler context manager: made during capture (built for real after the graph as
    ``cls(*args, **kwargs)``) or read from outside the frame (``source``)."""

    mutable = True

    def __init__(self, cls: type, args: list[Variable], kwargs: dict[str, Variable], source=None):
        self.cls = cls
        self.args = args
        self.kwargs = kwargs
        self.source = source

    def python_type(self):
        return self.cls

    def describe(self) -> str:
        name = f"{self.cls.__module__}.{self.cls.__qualname__}"
        if self.args and self.args[0].is_constant():
            return f"{name}({self.args[0].as_constant()!r})"
        return name

    def enter(self, tx) -> Variable:
        raise GraphBreak(
            f"{self.describe()} is entered natively, so that its state (a profiler's range, "
            "an autocast region made outside the trace) is the real one around the graphs "
            "inside it"
        )

    def getattr(self, tx, name):
        if name in RETURNS_SELF or callable(getattr(self.cls, name, None)):
            return MethodVariable(self, name)
        raise GraphBreak(f"attribute {name!r} of {self.describe()}, which runs natively")

    def call_method(self, tx, name, args, kwargs):
        if name in RETURNS_SELF and not args and not kwargs:
            return self
        raise GraphBreak(f"{self.describe()}.{name}() runs natively")

    def reconstruct(self, cg) -> None:
        if self.source is not None:
            self.source.emit(cg)
            return
        cg.call_object(self.cls, [*self.args, *self.kwargs.values()], tuple(self.kwargs))
