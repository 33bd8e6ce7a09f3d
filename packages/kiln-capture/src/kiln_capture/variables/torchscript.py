"""TorchScript's helpers and the ``typing`` forms their annotations name.

Library code written to be scriptable (``torch.nn.functional``, torchvision) calls
``torch.jit.annotate(List[Tensor], [])``, ``torch.jit.isinstance(x, List[int])`` and asks
``torch.jit.is_scripting()``. Eagerly these are plain Python: ``annotate`` returns its value,
``is_scripting`` is False, ``isinstance`` checks types and items. Capture answers them the
same way, at capture time, so the code around them stays in the graph.
"""

from __future__ import annotations

import types
import typing

import torch

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable


def is_typing_form(value) -> bool:
    """``List``, ``Optional``, ``Dict[str, Tensor]``, ``list[int]``, ``int | None``: an
    annotation that only describes types (subscripting it runs no code of the user's)."""
    return type(value).__module__ == "typing" or isinstance(
        value, (types.GenericAlias, types.UnionType)
    )


def type_argument(v: Variable):
    """A constant, class, typing form or tuple of them, as the argument of ``cls[...]``
    (1-tuple), or None where ``v`` is none of these."""
    from kiln_capture.variables.containers import TupleVariable

    if v.is_constant():
        return (v.as_constant(),)
    value = getattr(v, "fn", getattr(v, "value", None))
    if isinstance(value, type) or is_typing_form(value):
        return (value,)
    if isinstance(v, TupleVariable):
        items = [type_argument(item) for item in v.items]
        if all(item is not None for item in items):
            return (tuple(item[0] for item in items),)
    return None


def subscript_typing_form(tx, form, key: Variable) -> Variable | None:
    """``List[Tensor]``, ``Optional[int]``: the typing form made at capture time (None
    where the subscript is not made of types)."""
    from kiln_capture.variables.builder import wrap_derived

    argument = type_argument(key)
    if argument is None:
        return None
    return wrap_derived(tx, tx.run_user_code(lambda: form[argument[0]]))


def stand_in(v: Variable):
    """A Python value with the types ``v`` has on every call the guards pass (1-tuple):
    tensors as their fake example, containers item by item; None where unknown."""
    from kiln_capture.variables.containers import DictVariable, SequenceVariable
    from kiln_capture.variables.functions import real_value
    from kiln_capture.variables.tensor import TensorVariable

    if isinstance(v, TensorVariable):
        return (v.example,)
    if isinstance(v, SequenceVariable) and v.python_cls in (list, tuple):
        items = [stand_in(item) for item in v.items]
        if all(item is not None for item in items):
            return (v.python_cls(item[0] for item in items),)
        return None
    if isinstance(v, DictVariable):
        keys = [key.as_constant() if key.is_constant() else None for key, _ in v.entries.values()]
        values = [stand_in(value) for _, value in v.entries.values()]
        if all(value is not None for value in values) and None not in keys:
            return (dict(zip(keys, (value[0] for value in values), strict=True)),)
        return None
    return real_value(v)


def _annotate(tx, the_type, the_value):
    return the_value


def _jit_isinstance(tx, obj, target_type):
    value, target = stand_in(obj), type_argument(target_type)
    if value is None or target is None:
        raise GraphBreak(f"torch.jit.isinstance of {obj.describe()}")
    return ConstantVariable(tx.run_user_code(torch.jit.isinstance, value[0], target[0]))


def _answer(value):
    return lambda tx, *args, **kwargs: ConstantVariable(value)


# torch.jit's helpers, answered at capture time as they behave eagerly.
TORCHSCRIPT_CALLS = {
    torch.jit.is_scripting: _answer(False),
    torch.jit.is_tracing: _answer(False),
    torch._C._get_tracing_state: _answer(None),
    torch.jit.annotate: _annotate,
    torch.jit.isinstance: _jit_isinstance,
    typing.cast: _annotate,
}
