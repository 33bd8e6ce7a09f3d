"""Raising and handling exceptions inside the captured code."""

from __future__ import annotations

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.objects import ClassVariable, ExceptionVariable
from kiln_capture.versions import handles


def exception_of(value) -> BaseException:
    if isinstance(value, ExceptionVariable):
        return value.exc
    if isinstance(value, ClassVariable) and issubclass(value.value, BaseException):
        return value.value()
    raise GraphBreak(f"raising {value.describe()}")


@handles("RAISE_VARARGS")
def raise_varargs(tx, inst):
    if inst.arg == 0:
        raise GraphBreak("bare `raise` re-raising the active exception")
    if inst.arg == 2:
        cause = tx.pop()
        exc = exception_of(tx.pop())
        exc.__cause__ = None if cause.is_constant() else exception_of(cause)
        raise UserError(exc)
    raise UserError(exception_of(tx.pop()))


@handles("PUSH_EXC_INFO")
def push_exc_info(tx, inst):
    exc = tx.pop()
    tx.push(ConstantVariable(None))  # the previous exception, restored by POP_EXCEPT
    tx.push(exc)


@handles("POP_EXCEPT")
def pop_except(tx, inst):
    tx.pop()


@handles("CHECK_EXC_MATCH")
def check_exc_match(tx, inst):
    classes = tx.pop()
    exc = tx.peek()
    from kiln_capture.variables.builtin_calls import class_of

    tx.push(ConstantVariable(isinstance(exc.exc, class_of(classes))))


@handles("RERAISE")
def reraise(tx, inst):
    exc = tx.pop()
    if inst.arg:
        tx.pop()  # lasti
    raise UserError(exception_of(exc))
