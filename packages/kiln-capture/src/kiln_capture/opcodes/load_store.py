"""Loading and storing names, attributes and items; stack shuffling."""

from __future__ import annotations

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.variables.base import DeletedVariable
from kiln_capture.variables.builder import wrap_derived
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.functions import CellVariable
from kiln_capture.versions import PY, handles


def _name(arg):
    """The name of a LOAD_ATTR/LOAD_GLOBAL argument, with or without its flag."""
    return arg[-1] if isinstance(arg, tuple) else arg


@handles("NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS")
def nop(tx, inst):
    pass


@handles("POP_TOP")
def pop_top(tx, inst):
    tx.pop()


@handles("PUSH_NULL")
def push_null(tx, inst):
    tx.push(tx.null())


@handles("COPY")
def copy(tx, inst):
    tx.push(tx.peek(inst.arg))


@handles("SWAP")
def swap(tx, inst):
    tx.stack[-1], tx.stack[-inst.arg] = tx.stack[-inst.arg], tx.stack[-1]


@handles("LOAD_CONST")
def load_const(tx, inst):
    tx.push(wrap_derived(tx, inst.arg))


@handles("RETURN_CONST", min_version=(3, 12))
def return_const(tx, inst):
    from kiln_capture.translator import ReturnValue

    tx.push(wrap_derived(tx, inst.arg))
    tx.check_return()
    raise ReturnValue(tx.pop())


def _local(tx, name):
    value = tx.locals.get(name)
    if value is None or isinstance(value, DeletedVariable):
        raise UserError(
            UnboundLocalError(
                f"cannot access local variable {name!r} where it is not associated with a value"
            )
        )
    return tx.realize_local(name, value)


@handles("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(tx, inst):
    tx.push(_local(tx, _var_name(inst.arg)))


@handles("LOAD_FAST_AND_CLEAR", min_version=(3, 12))
def load_fast_and_clear(tx, inst):
    name = _var_name(inst.arg)
    tx.push(tx.locals.get(name) or DeletedVariable())
    tx.locals[name] = DeletedVariable()


@handles("LOAD_FAST_LOAD_FAST", min_version=(3, 13))
def load_fast_load_fast(tx, inst):
    first, second = inst.arg
    tx.push(_local(tx, first))
    tx.push(_local(tx, second))


@handles("STORE_FAST")
def store_fast(tx, inst):
    tx.locals[_var_name(inst.arg)] = tx.pop()


@handles("STORE_FAST_STORE_FAST", min_version=(3, 13))
def store_fast_store_fast(tx, inst):
    first, second = inst.arg
    tx.locals[first] = tx.pop()
    tx.locals[second] = tx.pop()


@handles("STORE_FAST_LOAD_FAST", min_version=(3, 13))
def store_fast_load_fast(tx, inst):
    first, second = inst.arg
    tx.locals[first] = tx.pop()
    tx.push(_local(tx, second))


@handles("DELETE_FAST")
def delete_fast(tx, inst):
    tx.locals[_var_name(inst.arg)] = DeletedVariable()


def _var_name(arg):
    return arg if isinstance(arg, str) else getattr(arg, "name", arg)


@handles("LOAD_GLOBAL")
def load_global(tx, inst):
    push_null, name = inst.arg if isinstance(inst.arg, tuple) else (False, inst.arg)
    if push_null and PY < (3, 13):
        tx.push(tx.null())
    tx.push(tx.load_global(name))
    if push_null and PY >= (3, 13):
        tx.push(tx.null())


@handles("STORE_GLOBAL")
def store_global(tx, inst):
    tx.store_global(inst.arg, tx.pop())


@handles("MAKE_CELL")
def make_cell(tx, inst):
    name = _var_name(inst.arg)
    value = tx.locals.get(name)
    if value is not None and not isinstance(value, DeletedVariable):
        value = tx.realize_local(name, value)
    tx.locals.pop(name, None)  # after realizing it, which stores the local again
    tx.cells[name] = CellVariable(contents=value)


@handles("LOAD_CLOSURE")
def load_closure(tx, inst):
    tx.push(tx.cells[_var_name(inst.arg)])


@handles("LOAD_DEREF")
def load_deref(tx, inst):
    name = _var_name(inst.arg)
    cell = tx.cells.get(name)
    if cell is None:
        raise GraphBreak(f"free variable {name!r} of unknown origin")
    if cell.contents is None and cell.real_cell is None:
        raise UserError(
            NameError(
                f"cannot access free variable {name!r} where it is not "
                f"associated with a value in enclosing scope"
            )
        )
    tx.push(cell.load(tx))


@handles("STORE_DEREF")
def store_deref(tx, inst):
    tx.cells[_var_name(inst.arg)].store(tx, tx.pop())


@handles("LOAD_ATTR")
def load_attr(tx, inst):
    if isinstance(inst.arg, tuple) and inst.arg[0]:  # 3.12+: a method load
        return load_method(tx, inst)
    obj = tx.pop()
    tx.push(obj.getattr(tx, _name(inst.arg)))


@handles("LOAD_METHOD", max_version=(3, 11))
def load_method(tx, inst):
    obj = tx.pop()
    method = obj.getattr(tx, _name(inst.arg))
    if PY < (3, 13):
        tx.push(tx.null())
        tx.push(method)
    else:
        tx.push(method)
        tx.push(tx.null())


@handles("STORE_ATTR")
def store_attr(tx, inst):
    obj = tx.pop()
    value = tx.pop()
    tx.store_attr(obj, inst.arg, value)


@handles("DELETE_ATTR")
def delete_attr(tx, inst):
    obj = tx.pop()
    deleter = getattr(obj, "delattr", None)
    if deleter is None:
        raise GraphBreak(f"deleting attribute {inst.arg!r} of {obj.describe()}")
    deleter(tx, inst.arg)


@handles("LOAD_SUPER_ATTR", min_version=(3, 12))
def load_super_attr(tx, inst):
    from kiln_capture.variables.objects import SuperVariable

    is_method, _, name = inst.arg if len(inst.arg) == 3 else (inst.arg[0], True, inst.arg[1])
    self_var = tx.pop()
    cls_var = tx.pop()
    tx.pop()  # the global super
    attr = SuperVariable(cls_var.value, self_var).getattr(tx, name)
    if is_method:
        if PY < (3, 13):
            tx.push(tx.null())
            tx.push(attr)
        else:
            tx.push(attr)
            tx.push(tx.null())
    else:
        tx.push(attr)


@handles("BINARY_SUBSCR")
def binary_subscr(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    tx.push(obj.getitem(tx, key))


@handles("STORE_SUBSCR")
def store_subscr(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    tx.setitem(obj, key, value)


@handles("DELETE_SUBSCR")
def delete_subscr(tx, inst):
    key = tx.pop()
    obj = tx.pop()
    obj.call_method(tx, "__delitem__", [key], {})


@handles("BINARY_SLICE", min_version=(3, 12))
def binary_slice(tx, inst):
    from kiln_capture.opcodes.build import make_slice

    end = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    tx.push(obj.getitem(tx, make_slice([start, end])))


@handles("STORE_SLICE", min_version=(3, 12))
def store_slice(tx, inst):
    from kiln_capture.opcodes.build import make_slice

    end = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    tx.setitem(obj, make_slice([start, end]), value)


@handles("IMPORT_NAME")
def import_name(tx, inst):
    fromlist = tx.pop().as_constant()
    level = tx.pop().as_constant()
    module = tx.run_user_code(__import__, inst.arg, tx.f_globals, None, fromlist, level)
    tx.push(wrap_derived(tx, module))


@handles("IMPORT_FROM")
def import_from(tx, inst):
    tx.push(tx.peek().getattr(tx, inst.arg))


@handles("LOAD_ASSERTION_ERROR")
def load_assertion_error(tx, inst):
    tx.push(wrap_derived(tx, AssertionError))


__all__ = ["ConstantVariable"]
