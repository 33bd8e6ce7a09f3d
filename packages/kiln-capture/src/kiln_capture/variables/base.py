"""The symbolic values the interpreter pushes on its stack.

A ``Variable`` stands for one Python value during capture. It knows the value's type, where
it came from (its ``source``, used by guards and to reload it), how to behave under
attribute access, calls, iteration and truth tests, and how to rebuild itself in generated
bytecode (``reconstruct``). What a variable cannot do raises ``GraphBreak``.
"""

from __future__ import annotations

from kiln_capture.exc import CaptureFailed, GraphBreak


class Variable:
    source = None
    mutable = False

    def python_type(self) -> type:
        raise NotImplementedError(type(self).__name__)

    def is_constant(self) -> bool:
        return False

    def as_constant(self):
        raise GraphBreak(f"{self.describe()} is not a Python constant here")

    def describe(self) -> str:
        try:
            return f"a {self.python_type().__name__}"
        except NotImplementedError:
            return type(self).__name__

    # --- behaviour --------------------------------------------------------------

    def getattr(self, tx, name: str) -> Variable:
        try:
            kind = self.python_type()
        except NotImplementedError:
            kind = None
        if kind is not None and callable(getattr(kind, name, None)):
            return MethodVariable(self, name)
        raise GraphBreak(f"attribute {name!r} of {self.describe()}")

    def call(self, tx, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        raise GraphBreak(f"calling {self.describe()}")

    def call_method(self, tx, name: str, args, kwargs) -> Variable:
        method = self.getattr(tx, name)
        if isinstance(method, MethodVariable) and method.obj is self:
            raise GraphBreak(f"method {name}() of {self.describe()}")
        return method.call(tx, args, kwargs)

    def unpack(self, tx) -> list[Variable]:
        raise GraphBreak(f"iterating over {self.describe()}")

    def truthy(self, tx) -> bool:
        raise GraphBreak(f"truth value of {self.describe()}")

    def getitem(self, tx, key: Variable) -> Variable:
        return self.call_method(tx, "__getitem__", [key], {})

    # --- code generation --------------------------------------------------------

    def reconstruct(self, cg) -> None:
        if self.source is not None:
            self.source.emit(cg)
            return
        raise CaptureFailed(f"cannot rebuild {self.describe()} after the graph")


class NullVariable(Variable):
    """The NULL that CPython pushes below (or above) a callable."""

    def describe(self) -> str:
        return "NULL"

    def reconstruct(self, cg) -> None:
        cg.push_null()


class DeletedVariable(Variable):
    """A local that was deleted or not yet bound."""

    def describe(self) -> str:
        return "an unbound local"


class MethodVariable(Variable):
    """``obj.name`` for a method of a value the interpreter models: calling it is
    ``obj.call_method(name, ...)``."""

    def __init__(self, obj: Variable, name: str):
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"method {self.name} of {self.obj.describe()}"

    def call(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, cg) -> None:
        cg.reconstruct(self.obj)
        cg.load_attr(self.name)
