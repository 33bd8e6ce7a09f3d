"""Jumps, loops, returns, context managers and generators."""

from __future__ import annotations

from kiln_capture.exc import CaptureFailed, GraphBreak
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import ListIteratorVariable
from kiln_capture.versions import PY, for_iter_exit_skips, handles


@handles("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def jump(tx, inst):
    tx.jump(inst.arg)


def conditional(pop_when: bool | None, kind: str):
    """POP_JUMP_IF_* handlers: jump when the condition holds."""

    def handler(tx, inst):
        value = tx.peek()
        if kind == "none":
            from kiln_capture.variables.ops import is_same

            condition = is_same(tx, value, ConstantVariable(None))
        else:
            condition = tx.truth(value)
        tx.pop()
        if condition == pop_when:
            tx.jump(inst.arg)

    return handler


for _name, _when, _kind in (
    ("TRUE", True, "truth"),
    ("FALSE", False, "truth"),
    ("NONE", True, "none"),
    ("NOT_NONE", False, "none"),
):
    handles(f"POP_JUMP_IF_{_name}", min_version=(3, 12))(conditional(_when, _kind))
    handles(f"POP_JUMP_FORWARD_IF_{_name}", max_version=(3, 11))(conditional(_when, _kind))
    handles(f"POP_JUMP_BACKWARD_IF_{_name}", max_version=(3, 11))(conditional(_when, _kind))


@handles("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP", max_version=(3, 11))
def jump_or_pop(tx, inst):
    want = inst.name == "JUMP_IF_TRUE_OR_POP"
    if tx.truth(tx.peek()) == want:
        tx.jump(inst.arg)
    else:
        tx.pop()


@handles("RETURN_VALUE")
def return_value(tx, inst):
    from kiln_capture.translator import ReturnValue

    tx.check_return()
    raise ReturnValue(tx.pop())


@handles("GET_ITER")
def get_iter(tx, inst):
    value = tx.pop()
    if isinstance(value, ListIteratorVariable):
        tx.push(value)
        return
    tx.push(ListIteratorVariable(value.unpack(tx)))


@handles("FOR_ITER")
def for_iter(tx, inst):
    iterator = tx.peek()
    if not isinstance(iterator, ListIteratorVariable):
        raise GraphBreak(f"iterating over {iterator.describe()}")
    item = iterator.next(tx)
    if item is not None:
        tx.push(item)
        return
    tx.pop()
    tx.ip = loop_exit(tx.program, tx.current_index)


def loop_exit(program, index: int) -> int:
    """Where an exhausted FOR_ITER at ``index`` goes on: its target, past what it skips
    there (``versions.for_iter_exit_skips``)."""
    target = program.target(program.instrs[index].arg)
    skipped = for_iter_exit_skips()
    found = tuple(inst.name for inst in program.instrs[target : target + len(skipped)])
    if found != skipped:
        raise CaptureFailed(f"a for loop's exit at {program.where(target)} holds {found}")
    return target + len(skipped)


@handles("END_FOR", min_version=(3, 12))
def end_for(tx, inst):
    tx.pop()
    if PY == (3, 12):
        tx.pop()


@handles("BEFORE_WITH")
def before_with(tx, inst):
    manager = tx.pop()
    enter = getattr(manager, "enter", None)
    if enter is not None:
        tx.push(ContextExit(manager))
        tx.push(enter(tx))
        return
    exit_method = manager.getattr(tx, "__exit__")
    entered = manager.call_method(tx, "__enter__", [], {})
    tx.push(exit_method)
    tx.push(entered)


class ContextExit(Variable):
    """The bound ``__exit__`` that BEFORE_WITH leaves on the stack."""

    def __init__(self, manager):
        self.manager = manager

    def describe(self) -> str:
        return f"exit of {self.manager.describe()}"

    def call(self, tx, args, kwargs):
        self.manager.exit(tx)
        return ConstantVariable(None)

    def reconstruct(self, cg) -> None:
        rebuild = getattr(self.manager, "reconstruct_exit", None)
        if rebuild is None:
            from kiln_capture.exc import CaptureFailed

            raise CaptureFailed(f"cannot rebuild the exit of {self.manager.describe()}")
        rebuild(cg)


@handles("WITH_EXCEPT_START")
def with_except_start(tx, inst):
    from kiln_capture.variables.objects import ClassVariable

    exit_fn = tx.peek(4) if PY < (3, 13) else tx.peek(5)
    exc = tx.peek()
    if isinstance(exit_fn, ContextExit):
        on_exception = getattr(exit_fn.manager, "exit_on_exception", None)
        if on_exception is not None:  # it may handle the exception (suppress it)
            tx.push(ConstantVariable(on_exception(tx, exc)))
            return
        exit_fn.call(tx, [], {})
        tx.push(ConstantVariable(False))
        return
    exc_type = ClassVariable(type(exc.exc))
    tx.push(exit_fn.call(tx, [exc_type, exc, ConstantVariable(None)], {}))


@handles("RETURN_GENERATOR")
def return_generator(tx, inst):
    tx.push(ConstantVariable(None))


@handles("YIELD_VALUE")
def yield_value(tx, inst):
    if getattr(tx, "suspends", False):  # run step by step: stop here, None is sent back
        from kiln_capture.translator import Suspended

        value = tx.pop()
        tx.push(ConstantVariable(None))
        raise Suspended(value, tx.current_index)
    yielded = getattr(tx, "yielded", None)
    if yielded is None:
        raise GraphBreak("yield outside an inlined generator")
    yielded.append(tx.pop())
    tx.push(ConstantVariable(None))


@handles("GET_YIELD_FROM_ITER")
def get_yield_from_iter(tx, inst):
    get_iter(tx, inst)


@handles("SEND")
def send(tx, inst):
    """``yield from``: each step yields the next item; exhaustion jumps past the loop."""
    tx.pop()  # the value sent in (always None here)
    iterator = tx.peek()
    if not isinstance(iterator, ListIteratorVariable):
        raise GraphBreak("yield from a non-list iterator")
    item = iterator.next(tx)
    if item is not None:
        tx.push(item)
        return
    if PY < (3, 12):
        tx.pop()  # 3.11 drops the iterator here; 3.12+ leaves it for END_SEND
    tx.push(ConstantVariable(None))
    tx.jump(inst.arg)


@handles("END_SEND", min_version=(3, 12))
def end_send(tx, inst):
    value = tx.pop()
    tx.pop()
    tx.push(value)
