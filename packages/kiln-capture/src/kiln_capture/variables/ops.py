"""Python's operators on variables: arithmetic and comparison through the graph for tensors
and symbolic sizes, constant folding for Python values, and the container operators."""

from __future__ import annotations

import operator

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.variables import ndarray
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import (
    DictVariable,
    ListVariable,
    SequenceVariable,
    SetVariable,
    SizeVariable,
    TupleVariable,
)
from kiln_capture.variables.ndarray import NumpyArrayVariable
from kiln_capture.variables.tensor import SymNodeVariable, TensorVariable

GRAPH_TYPES = (TensorVariable, SymNodeVariable)


def is_graph_value(v: Variable) -> bool:
    return isinstance(v, GRAPH_TYPES)


def apply_operator(tx, op, args: list[Variable]) -> Variable:
    """``op(*args)`` for an ``operator`` function: in the graph, folded, or on containers."""
    if any(isinstance(a, NumpyArrayVariable) for a in args):
        return ndarray.call_operator(tx, op, args)
    if any(is_graph_value(a) for a in args):
        if op in (operator.contains,):
            raise GraphBreak("`in` on a tensor needs its data")
        return tx.output.call_graph("call_function", op, args, {})
    if all(a.is_constant() for a in args):
        return ConstantVariable(tx.run_user_code(op, *(a.as_constant() for a in args)))
    handled = container_operator(tx, op, args)
    if handled is not None:
        return handled
    name = DUNDER.get(op)
    if name is not None and len(args) == 2:
        return args[0].call_method(tx, name, [args[1]], {})
    name = getattr(op, "__name__", repr(op))
    raise GraphBreak(f"operator {name} on {', '.join(a.describe() for a in args)}")


DUNDER = {
    operator.add: "__add__",
    operator.sub: "__sub__",
    operator.mul: "__mul__",
    operator.truediv: "__truediv__",
    operator.eq: "__eq__",
    operator.ne: "__ne__",
    operator.getitem: "__getitem__",
    operator.or_: "__or__",
    operator.and_: "__and__",
    operator.sub: "__sub__",
    operator.xor: "__xor__",
}


def as_sequence(v: Variable) -> Variable:
    """A constant tuple as a tuple variable, so it concatenates with one holding sizes."""
    if isinstance(v, ConstantVariable) and type(v.value) is tuple:
        return TupleVariable([ConstantVariable(item) for item in v.value])
    return v


def concatenated(a: SequenceVariable, b: SequenceVariable) -> Variable | None:
    """``a + b`` of two sequences, of the class Python gives (a ``torch.Size`` with a
    tuple on either side is a ``torch.Size``), or None where Python raises."""
    import torch

    if a.mutable or b.mutable:
        return ListVariable(a.items + b.items) if a.python_cls is b.python_cls else None
    classes = {a.python_cls, b.python_cls}
    if not all(issubclass(cls, tuple) for cls in classes):
        return None
    if torch.Size in classes:
        return SizeVariable(a.items + b.items)
    return TupleVariable(a.items + b.items)  # named tuples too concatenate to a tuple


def container_operator(tx, op, args):
    a = args[0]
    b = args[1] if len(args) > 1 else None
    if op in (operator.add, operator.iadd) and (
        isinstance(a, SequenceVariable) or isinstance(b, SequenceVariable)
    ):
        a, b = as_sequence(a), as_sequence(b)
    if (
        op in (operator.add, operator.iadd)
        and isinstance(a, SequenceVariable)
        and isinstance(b, SequenceVariable)
    ):
        if op is operator.iadd and isinstance(a, ListVariable):
            return a.call_method(tx, "__iadd__", [b], {})
        joined = concatenated(a, b)
        if joined is not None:
            return joined
        raise UserError(
            TypeError(
                f"can only concatenate {a.python_cls.__name__} "
                f'(not "{b.python_cls.__name__}") to {a.python_cls.__name__}'
            )
        )
    if op in (operator.mul, operator.imul):
        seq, n = (a, b) if isinstance(a, SequenceVariable) else (b, a)
        if isinstance(seq, SequenceVariable) and n.is_constant():
            items = seq.items * n.as_constant()
            return ListVariable(items) if isinstance(seq, ListVariable) else TupleVariable(items)
    if op is operator.getitem:
        return a.getitem(tx, b)
    if op is operator.contains:
        return ConstantVariable(contains(tx, a, b))
    if op in (operator.eq, operator.ne) and isinstance(a, (SequenceVariable, DictVariable)):
        equal = compare_equal(tx, a, b)
        return ConstantVariable(equal if op is operator.eq else not equal)
    if op in (operator.or_, operator.and_, operator.sub, operator.xor) and isinstance(
        a, SetVariable
    ):
        name = {
            operator.or_: "union",
            operator.and_: "intersection",
            operator.sub: "difference",
            operator.xor: "symmetric_difference",
        }[op]
        return a.call_method(tx, name, [b], {})
    if op is operator.or_ and isinstance(a, DictVariable) and isinstance(b, DictVariable):
        return DictVariable({**a.entries, **b.entries}, cls=a.python_cls)
    return None


def contains(tx, container: Variable, item: Variable) -> bool:
    if isinstance(container, (DictVariable, SetVariable)):
        return container.call_method(tx, "__contains__", [item], {}).as_constant()
    if isinstance(container, SequenceVariable):
        return container.contains(tx, item)
    if container.is_constant() and item.is_constant():
        return item.as_constant() in container.as_constant()
    return container.call_method(tx, "__contains__", [item], {}).truthy(tx)


def compare_equal(tx, a: Variable, b: Variable) -> bool:
    """Python ``a == b`` where the answer is known at capture time."""
    if a is b:
        return True
    if a.is_constant() and b.is_constant():
        return a.as_constant() == b.as_constant()
    if is_graph_value(a) or is_graph_value(b):
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            raise GraphBreak("comparing a tensor for equality needs its data")
        return bool(apply_operator(tx, operator.eq, [a, b]).truthy(tx))
    if isinstance(a, SequenceVariable) and isinstance(b, SequenceVariable):
        return (
            a.python_cls is b.python_cls
            and len(a.items) == len(b.items)
            and all(compare_equal(tx, x, y) for x, y in zip(a.items, b.items, strict=True))
        )
    if isinstance(a, DictVariable) and isinstance(b, DictVariable):
        return a.entries.keys() == b.entries.keys() and all(
            compare_equal(tx, a.entries[k][1], b.entries[k][1]) for k in a.entries
        )
    identity_a, identity_b = identity(a), identity(b)
    if identity_a is not None and identity_b is not None:
        return identity_a == identity_b
    return False


def identity(v: Variable):
    """A key that is equal for two variables exactly when they stand for the same object."""
    if hasattr(v, "identity_key"):
        return v.identity_key()
    value = getattr(v, "value", None)
    if value is not None and not v.is_constant():
        return ("object", id(value))
    return None


def is_same(tx, a: Variable, b: Variable) -> bool:
    """Python ``a is b``."""
    if a is b:
        return True
    if a.is_constant() and b.is_constant():
        va, vb = a.as_constant(), b.as_constant()
        if va is None or vb is None or isinstance(va, bool) or isinstance(vb, bool):
            return va is vb
        return va is vb or (type(va) is type(vb) and va == vb and isinstance(va, (type, str)))
    ia, ib = identity(a), identity(b)
    if ia is not None and ib is not None:
        return ia == ib
    if a.is_constant() != b.is_constant():
        return False
    raise GraphBreak(f"`is` between {a.describe()} and {b.describe()}")


def product(tx, items: list[Variable]) -> Variable:
    result: Variable = ConstantVariable(1)
    for item in items:
        result = apply_operator(tx, operator.mul, [result, item])
    return result


def sort_variables(tx, items: list[Variable], key: Variable | None, reverse: bool) -> list:
    keyed = []
    for item in items:
        k = (
            key.call(tx, [item], {})
            if key is not None and not (key.is_constant() and key.as_constant() is None)
            else item
        )
        keyed.append((k.as_constant(), item))
    keyed.sort(key=lambda pair: pair[0], reverse=reverse)
    return [item for _, item in keyed]


def truth(tx, v: Variable) -> bool:
    return v.truthy(tx)
