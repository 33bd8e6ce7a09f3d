"""Calls and function creation."""

from __future__ import annotations

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import NullVariable
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import DictVariable, TupleVariable
from kiln_capture.variables.functions import NestedFunctionVariable
from kiln_capture.versions import PY, handles


@handles("KW_NAMES", max_version=(3, 12))
def kw_names(tx, inst):
    tx.kw_names = tuple(inst.arg)


def split_kwargs(args, names):
    if not names:
        return args, {}
    positional = args[: len(args) - len(names)]
    keywords = dict(zip(names, args[len(args) - len(names) :], strict=True))
    return positional, keywords


def pop_callable(tx, args):
    """Pop the callable and its NULL-or-self slot, in this version's order."""
    if PY >= (3, 13):
        self_or_null = tx.pop()
        fn = tx.pop()
    else:
        second = tx.pop()
        first = tx.pop()
        fn, self_or_null = (second, first) if isinstance(first, NullVariable) else (first, second)
    if not isinstance(self_or_null, NullVariable):
        args = [self_or_null, *args]
    return fn, args


@handles("CALL")
def call(tx, inst):
    names, tx.kw_names = tx.kw_names, ()
    args = tx.popn(inst.arg)
    fn, args = pop_callable(tx, args)
    positional, keywords = split_kwargs(args, names)
    tx.push(tx.call(fn, list(positional), keywords))


@handles("CALL_KW", min_version=(3, 13))
def call_kw(tx, inst):
    names = tx.pop().as_constant()
    args = tx.popn(inst.arg)
    fn, args = pop_callable(tx, args)
    positional, keywords = split_kwargs(args, names)
    tx.push(tx.call(fn, list(positional), keywords))


@handles("CALL_FUNCTION_EX")
def call_function_ex(tx, inst):
    kwargs = tx.pop() if inst.arg & 1 else DictVariable({})
    args = tx.pop()
    if PY >= (3, 13):
        tx.pop()  # NULL
        fn = tx.pop()
    else:
        fn = tx.pop()
        if isinstance(tx.peek(), NullVariable):
            tx.pop()
    if not isinstance(kwargs, DictVariable):
        kwargs = kwargs.as_dict(tx) if hasattr(kwargs, "as_dict") else kwargs
    positional = args.unpack(tx)
    keywords = {k: v for k, (_, v) in kwargs.entries.items()}
    tx.push(tx.call(fn, positional, keywords))


@handles("CALL_INTRINSIC_1", min_version=(3, 12))
def call_intrinsic_1(tx, inst):
    name = getattr(inst.arg, "name", str(inst.arg))
    value = tx.pop()
    if name == "INTRINSIC_LIST_TO_TUPLE":
        tx.push(TupleVariable(value.items))
    elif name == "INTRINSIC_UNARY_POSITIVE":
        import operator

        from kiln_capture.opcodes.operators import apply_operator

        tx.push(apply_operator(tx, operator.pos, [value]))
    elif name == "INTRINSIC_STOPITERATION_ERROR":
        tx.push(value)
    else:
        raise GraphBreak(f"intrinsic {name}")


@handles("MAKE_FUNCTION")
def make_function(tx, inst):
    code = tx.pop()
    flags = inst.arg if PY < (3, 13) else 0
    qualname = code.as_constant().co_qualname
    closure = tx.pop().items if flags & 0x08 else None
    if flags & 0x04:
        tx.pop()  # annotations
    kwdefaults = tx.pop() if flags & 0x02 else None
    defaults = tx.pop() if flags & 0x01 else None
    tx.push(
        NestedFunctionVariable(
            code.as_constant(), qualname, defaults, kwdefaults, closure, tx.f_globals
        )
    )


@handles("SET_FUNCTION_ATTRIBUTE", min_version=(3, 13))
def set_function_attribute(tx, inst):
    fn = tx.pop()
    value = tx.pop()
    flag = int(inst.arg)
    if flag & 0x08:
        fn.closure = value.items
    elif flag & 0x02:
        fn.kwdefaults = value
    elif flag & 0x01:
        fn.defaults = value
    tx.push(fn)


__all__ = ["ConstantVariable"]


@handles("LOAD_BUILD_CLASS")
def load_build_class(tx, inst):
    from kiln_capture.variables.class_statements import BuildClassVariable

    tx.push(BuildClassVariable())
