"""A graph break at a ``for`` loop's FOR_ITER, on an iterator that capture does not trace.

A break inside a loop body hands the loop's iterator to the resume function, where it is
not traced (``sources.COMPREHENSION_ITERATOR`` says why): that trace stops at the loop's
next FOR_ITER. The step then runs natively, as a conditional jump does at a break: the
generated code rebuilds the stack, runs FOR_ITER, and calls one of two resume functions,
one at the loop body with the item on the stack, one at the loop's exit.

The body's resume function breaks again (at the call that broke the loop, then at FOR_ITER),
so each item nests a few calls. Resume functions map back to the original code and are
captured once per place, whichever item reaches them: the whole loop compiles a bounded
number of graphs, but the Python stack grows with every item. So the step runs natively
only where the iterator tells how many items it has left (``operator.length_hint``, which
takes none) and they are few, and the guard keeps it so. Any other iterator (a generator,
an unknown or greater length) fails the capture as before: the rest of the function runs
eagerly.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from bytecode import Instr, TryBegin

from kiln_capture import versions
from kiln_capture.exc import CaptureFailed
from kiln_capture.output_graph import OutputGraph
from kiln_capture.variables.base import Variable

# the most items a loop may have left for its steps to run natively (each nests a few calls)
MAX_NATIVE_STEPS = 64
_UNKNOWN = -1


def guard_native_steps(output: OutputGraph, iterator: Variable, where: str) -> None:
    """Let the loop over ``iterator`` step natively, guarded on its having few items left;
    CaptureFailed where it cannot."""
    value = getattr(iterator, "value", None)
    if iterator.source is None or value is None:
        raise CaptureFailed(f"graph break at FOR_ITER ({where}) cannot be resumed")
    left = items_left(value)
    if not 0 <= left <= MAX_NATIVE_STEPS:
        about = "an unknown number of" if left == _UNKNOWN else str(left)
        raise CaptureFailed(
            f"graph break at FOR_ITER ({where}) cannot be resumed: the iterator has {about} "
            f"items left (at most {MAX_NATIVE_STEPS} are resumed one by one)"
        )
    expr = output.guards.bind(iterator.source)
    output.guards.add(
        f"0 <= ___items_left({expr}) <= {MAX_NATIVE_STEPS}",
        f"{expr} has at most {MAX_NATIVE_STEPS} items left",
        ___items_left=items_left,
    )


def items_left(iterator) -> int:
    """How many items ``iterator`` has left, as it tells without giving any; -1 where it
    does not tell (or its answer raises)."""
    try:
        return operator.length_hint(iterator, _UNKNOWN)
    except Exception:  # a user's __length_hint__ may raise: not known
        return _UNKNOWN


def emit_native_step(
    cg, handler_entry: TryBegin | None, resume_body: Callable, resume_exit: Callable
) -> None:
    """FOR_ITER on the iterator the generated code pushed last (inside the original's
    handler, if any), then ``resume_body()`` with the item pushed on it; at its exit label,
    after what FOR_ITER skips there, ``resume_exit()`` with the iterator gone."""
    exhausted = cg.new_label()
    cg.in_handler_region(handler_entry, Instr("FOR_ITER", exhausted))
    resume_body()
    cg.emit(exhausted, *versions.for_iter_exit_instrs())
    resume_exit()
