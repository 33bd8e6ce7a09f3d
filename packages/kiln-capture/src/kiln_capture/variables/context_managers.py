"""``@contextlib.contextmanager`` context managers made inside the captured frame.

Calling a decorated function makes a ``contextlib._GeneratorContextManager``; here it is a
:class:`GeneratorContextManagerVariable` instead, and the generator function is traced in
two steps, as CPython runs it: entering the ``with`` block runs its body (inlined) up to
its ``yield``, whose value is what ``as`` binds; leaving the block runs the rest. An
exception raised in the block is thrown in at the ``yield``, so ``try``/``finally`` and
``except`` around it behave as they do eagerly (an exception the generator swallows is
suppressed).

A graph break inside the block cannot resume there: the generator's state lives in the
trace only. The frame is then traced again and breaks at the ``with`` statement instead:
the context manager is made for real and entered natively, and the block continues in a
resume function, which is captured in turn (the ``__exit__`` it calls runs natively).
"""

from __future__ import annotations

import contextlib

from kiln_capture.exc import GraphBreak, RestartAnalysis, UserError
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import DictVariable, TupleVariable


def is_generator_context_manager_class(cls) -> bool:
    return cls is contextlib._GeneratorContextManager


class GeneratorContextManagerVariable(Variable):
    """``contextlib._GeneratorContextManager(func, args, kwds)``, made during capture."""

    mutable = True

    def __init__(self, func: Variable, args: list[Variable], kwargs: dict[str, Variable]):
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.generator = None  # the generator's translator, once entered
        self.yield_index: int | None = None  # where it is suspended
        self.entered_at: tuple | None = None  # (translator, index of the BEFORE_WITH)

    def python_type(self):
        return contextlib._GeneratorContextManager

    def describe(self) -> str:
        name = getattr(getattr(self.func, "fn", None), "__qualname__", "a generator")
        return f"the @contextmanager {name}"

    # --- with ---------------------------------------------------------------------

    def enter(self, tx) -> Variable:
        if self.generator is not None:
            raise GraphBreak(f"entering {self.describe()} twice")
        self.entered_at = (tx, tx.current_index)
        self.generator = tx.child_for(self.func, self.args, self.kwargs)
        self.generator.suspends = True
        value = self.resume(lambda: self.generator.run())
        if value is None:
            raise UserError(RuntimeError("generator didn't yield"))
        return value

    def exit(self, tx) -> Variable:
        if self.resume(lambda: self.generator.run()) is not None:
            raise UserError(RuntimeError("generator didn't stop"))
        return ConstantVariable(None)

    def exit_on_exception(self, tx, exc: Variable) -> bool:
        """The block raised ``exc``: thrown into the generator at its ``yield``. Whether
        the generator swallowed it (the ``with`` statement then goes on after the block)."""
        thrown = UserError(exc.exc)

        def throw():
            self.generator.handle_exception(self.yield_index, thrown)
            return self.generator.run()

        try:
            if self.resume(throw) is not None:
                raise UserError(RuntimeError("generator didn't stop after throw()"))
        except UserError as raised:
            if raised.exc is exc.exc:
                return False
            raise
        return True

    def resume(self, step) -> Variable | None:
        """Run the generator on to its next ``yield`` (its value) or its end (None)."""
        from kiln_capture.translator import Suspended

        try:
            step()
        except Suspended as stop:
            self.yield_index = stop.index
            return stop.value
        return None

    # --- after the graph ------------------------------------------------------------

    def reconstruct(self, cg) -> None:
        if self.generator is not None:
            self.break_at_with()
        cg.call_object(
            contextlib._GeneratorContextManager,
            [
                self.func,
                TupleVariable(list(self.args)),
                DictVariable({k: (ConstantVariable(k), v) for k, v in self.kwargs.items()}),
            ],
        )

    def reconstruct_exit(self, cg) -> None:
        self.break_at_with()

    def break_at_with(self):
        """The frame broke inside the block: trace it again, breaking at the ``with``."""
        from kiln_capture.exc import CaptureFailed
        from kiln_capture.program import source_line

        translator, index = self.entered_at
        if translator.parent is not None:
            raise CaptureFailed(f"a graph break inside {self.describe()} in an inlined call")
        where = source_line(translator.program, index)
        raise RestartAnalysis(index, f"a graph break inside {self.describe()}", where)
