"""From real Python values to variables, installing the guards that make the capture valid.

``wrap`` is used for values that come from outside the frame (arguments, globals,
attributes, closure cells): it records a guard for each value it looks at. ``wrap_derived``
is for values computed during capture from constants: they need no guard.
"""

from __future__ import annotations

import collections
import enum
import functools
import types

import torch

from kiln_capture.module_calls import has_own_hooks
from kiln_capture.sources import COMPREHENSION_ITERATOR, ITERATOR_TYPES, ItemSource
from kiln_capture.variables.base import MethodVariable, Variable
from kiln_capture.variables.constant import ConstantVariable, is_constant_value
from kiln_capture.variables.containers import (
    DictVariable,
    ListVariable,
    NamedTupleVariable,
    SetVariable,
    TupleVariable,
)
from kiln_capture.variables.functions import (
    BoundMethodVariable,
    TorchFunctionVariable,
    UserFunctionVariable,
    is_torch_callable,
)
from kiln_capture.variables.native_context_managers import (
    NativeContextManagerVariable,
    is_native_context_manager,
)
from kiln_capture.variables.ndarray import is_ndarray, is_numpy_function


def is_namedtuple_class(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def wrap(tx, value, source) -> Variable:
    """A variable for ``value`` read from ``source``, with the guards it needs."""
    if source is None:
        return wrap_derived(tx, value)
    cached = tx.output.wrapped.get(source)
    if cached is not None:
        return cached
    variable = _wrap_new(tx, value, source)
    tx.output.wrapped[source] = variable
    return variable


def _wrap_new(tx, value, source) -> Variable:
    from kiln_capture.variables import objects

    guards = tx.output.guards
    kind = type(value)
    if isinstance(value, torch.Tensor):
        return tx.output.add_input(value, source)
    if is_ndarray(value):
        from kiln_capture.variables.ndarray import wrap_ndarray

        return wrap_ndarray(tx, value, source)
    if kind is int and source.expr() in tx.output.dynamic.ints:
        return tx.output.add_int_input(value, source)
    if is_constant_value(value):
        guards.constant(source, value)
        return ConstantVariable(value, source)
    if isinstance(value, enum.Enum):
        guards.identity(source, value)
        return ConstantVariable(value, source)
    if kind in (list, tuple, torch.Size) or is_namedtuple_class(kind):
        guards.type_and_length(source, value)
        items = [wrap(tx, item, ItemSource(source, i)) for i, item in enumerate(value)]
        if kind is torch.Size:
            from kiln_capture.variables.containers import SizeVariable

            return SizeVariable(items, source)
        if kind is list:
            return ListVariable(items, source)
        if kind is tuple:
            return TupleVariable(items, source)
        return NamedTupleVariable(items, kind, source)
    if kind in (dict, collections.OrderedDict):
        guards.type_and_keys(source, value)
        entries = {
            entry_key: (key_var, wrap(tx, item, ItemSource(source, key)))
            for key, item in value.items()
            for entry_key, key_var in [dict_key(tx, key)]
        }
        return DictVariable(entries, source, cls=kind)
    if kind in (set, frozenset):
        guards.constant_set(source, value)
        return SetVariable([ConstantVariable(v) for v in value], source, cls=kind)
    if isinstance(value, torch.nn.Module):
        # by type, not identity: another instance of the class reuses the capture (its
        # parameters are graph inputs and its attributes are guarded where they are read)
        guards.type(source, value)
        if not has_own_hooks(value):  # one with hooks is called at a graph break, as it is
            guards.no_hooks(source, value)
        return objects.ModuleVariable(value, source)
    if isinstance(value, types.ModuleType):
        guards.identity(source, value)
        return objects.PythonModuleVariable(value, source)
    if kind in ITERATOR_TYPES and source == COMPREHENSION_ITERATOR:
        return wrap_iterator(tx, value, source)
    if isinstance(value, BaseException):
        guards.type(source, value)
        return objects.ExceptionVariable(value, source)
    known = tx.output.objects_by_id.get(id(value))
    if known is not None:
        # an object already read another way (a config shared by every layer): one
        # identity check, and its attributes are read and guarded once
        guards.same_object(source, known.source)
        return known
    variable = wrap_callable_or_object(tx, value, source, guard=True)
    if type(variable) is objects.ObjectVariable:
        tx.output.objects_by_id[id(value)] = variable
    return variable


def wrap_iterator(tx, value, source) -> Variable:
    """A list or tuple iterator (a comprehension's): the items it has left, each read from
    the sequence under it by index; guarded on where it stands and the sequence's type and
    length. What the captured code takes from it is taken from it after the graph."""
    from kiln_capture.sources import IteratorSequenceSource, iterator_position, iterator_sequence
    from kiln_capture.variables.containers import ArgumentIteratorVariable

    guards = tx.output.guards
    guards.type(source, value)
    position, sequence = iterator_position(value), iterator_sequence(value)
    expr = guards.bind(source)
    guards.add(f"___iterator_position({expr}) == {position}", f"{expr} has given {position}")
    under = IteratorSequenceSource(source)
    guards.type_and_length(under, sequence)
    items = [wrap(tx, sequence[i], ItemSource(under, i)) for i in range(position, len(sequence))]
    return ArgumentIteratorVariable(items, source)


def wrap_callable_or_object(tx, value, source, guard: bool, trace_numpy: bool = True) -> Variable:
    from kiln_capture.variables import objects
    from kiln_capture.variables.builtin_calls import BuiltinVariable, is_pure_builtin

    guards = tx.output.guards
    if guard:
        if isinstance(value, types.MethodType):
            guards.method(source, value)
        elif guarded_by_code(value, source):
            guards.function_code(source, value)
        elif _identity_guarded(value):
            guards.identity(source, value)
        else:
            guards.type(source, value)
    if source is not None and (
        is_native_context_manager(type(value)) or isinstance(value, torch.autocast)
    ):  # an autocast region entered outside the trace (at a break) is also left natively
        return NativeContextManagerVariable(type(value), [], {}, source)
    if is_special_torch_function(value):
        return TorchFunctionVariable(value, source)
    if trace_numpy and is_numpy_function(value):
        from kiln_capture.variables.ndarray import NumpyFunctionVariable

        fallback = wrap_callable_or_object(tx, value, source, guard=False, trace_numpy=False)
        return NumpyFunctionVariable(value, fallback, source)
    if has_builtin_handler(value):
        return BuiltinVariable(value, source)
    if isinstance(value, types.FunctionType):
        from kiln_capture.variables.functions import PURE_MODULES, PureFunctionVariable

        if (value.__module__ or "").split(".")[0] in PURE_MODULES:
            return PureFunctionVariable(value, source)
        return UserFunctionVariable(value, source)
    if isinstance(value, types.MethodType):
        self_var = (
            wrap_derived(tx, value.__self__)
            if source is None
            else wrap_method_self(tx, value, source)
        )
        if isinstance(self_var, NativeContextManagerVariable):  # not traced: called natively
            return MethodVariable(self_var, value.__name__)
        func = wrap_callable_or_object(tx, value.__func__, None, guard=False)
        return BoundMethodVariable(func, self_var, source)
    if is_torch_callable(value):
        return TorchFunctionVariable(value, source)
    if isinstance(value, (types.BuiltinFunctionType, functools.partial)) or (
        callable(value) and is_pure_builtin(value)
    ):
        if isinstance(value, functools.partial):
            return objects.PartialVariable(value, source, tx)
        return BuiltinVariable(value, source)
    if isinstance(value, type):
        return objects.ClassVariable(value, source)
    return objects.ObjectVariable(value, source)


def wrap_method_self(tx, method, source):
    from kiln_capture.sources import AttrSource

    return wrap(tx, method.__self__, AttrSource(source, "__self__"))


def guarded_by_code(value, source) -> bool:
    """A function a ``def`` or ``lambda`` made inside another function's run, with no
    defaults (which a guard on its code would not cover), passed in as an argument (a
    resume function's local made before the break): a new object at every call, guarded
    on its code. The object differs from call to call, so it is never baked into the
    generated code (``native_calls.emit_callee``)."""
    from kiln_capture.sources import LocalSource

    return (
        isinstance(value, types.FunctionType)
        and "<locals>" in value.__qualname__
        and value.__defaults__ is None
        and value.__kwdefaults__ is None
        and source is not None
        and isinstance(source.root(), LocalSource)
    )


def _identity_guarded(value) -> bool:
    if isinstance(value, types.BuiltinMethodType) and not isinstance(
        getattr(value, "__self__", None), types.ModuleType
    ):
        return False  # a builtin method bound to an object is a new object at every read
    # functions, classes and builtins by identity; instances (callable or not) by type
    return (
        isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType))
        or is_torch_callable(value)
        or is_numpy_function(value)
    )


def wrap_derived(tx, value) -> Variable:
    """A variable for a value computed during capture from known values (no guard)."""
    if isinstance(value, Variable):
        return value
    if is_constant_value(value) or isinstance(value, enum.Enum):
        return ConstantVariable(value)
    kind = type(value)
    if kind is list:
        return ListVariable([wrap_derived(tx, v) for v in value])
    if kind is tuple:
        return TupleVariable([wrap_derived(tx, v) for v in value])
    if is_namedtuple_class(kind):
        return NamedTupleVariable([wrap_derived(tx, v) for v in value], kind)
    if kind is torch.Size:
        from kiln_capture.variables.containers import SizeVariable

        return SizeVariable([wrap_derived(tx, v) for v in value])
    if kind in (dict, collections.OrderedDict):
        entries = {}
        for key, item in value.items():
            entry_key, key_var = dict_key(tx, key)
            entries[entry_key] = (key_var, wrap_derived(tx, item))
        return DictVariable(entries, cls=kind)
    if kind in (set, frozenset):
        return SetVariable([wrap_derived(tx, v) for v in value], cls=kind)
    if isinstance(value, torch.Tensor):
        from kiln_capture.exc import GraphBreak

        raise GraphBreak("a tensor created outside the graph during capture")
    from kiln_capture.variables import objects

    if isinstance(value, torch.nn.Module):
        return objects.ModuleVariable(value, None)
    if isinstance(value, types.ModuleType):
        return objects.PythonModuleVariable(value, None)
    return wrap_callable_or_object(tx, value, None, guard=False)


def dict_key(tx, key) -> tuple[object, Variable]:
    """A real dict's key as a ``DictVariable`` entry's: (the value lookups index it by, the
    key's variable). A class or function is indexed by identity, as the variable a lookup
    passes (``d[float]``) is."""
    from kiln_capture.exc import GraphBreak
    from kiln_capture.variables.containers import constant_key

    if is_constant_value(key):
        return key, ConstantVariable(key)
    try:
        key_var = wrap_derived(tx, key)
        return constant_key(tx, key_var), key_var
    except GraphBreak:  # a tensor key: only lookups by it break
        return key, ConstantVariable(key)


def has_builtin_handler(value) -> bool:
    from kiln_capture.variables.builtin_calls import BUILTIN_HANDLERS

    try:
        return value in BUILTIN_HANDLERS
    except TypeError:  # unhashable
        return False


def is_special_torch_function(value) -> bool:
    """torch functions answered from global state or turned into context managers."""
    from kiln_capture.variables.torch_calls import CONTEXT_MANAGERS, GRAPH_BREAKING, STATE_READERS

    try:
        return value in STATE_READERS or value in CONTEXT_MANAGERS or value in GRAPH_BREAKING
    except TypeError:  # unhashable
        return False
