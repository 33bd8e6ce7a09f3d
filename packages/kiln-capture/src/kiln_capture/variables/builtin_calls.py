"""Python's builtins and pure standard-library functions, applied to variables.

Each builtin has a handler in ``BUILTIN_HANDLERS``; a pure function whose arguments are all
constants is folded by calling it. Anything else breaks the graph.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import functools
import itertools
import math
import operator
import types

import torch

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.variables.base import Variable
from kiln_capture.variables.builder import is_namedtuple_class, wrap_derived
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import (
    DictVariable,
    DictViewVariable,
    ListIteratorVariable,
    ListVariable,
    SequenceVariable,
    SetVariable,
    TupleVariable,
    mapping_pairs,
)
from kiln_capture.variables.context_managers import (
    GeneratorContextManagerVariable,
    is_generator_context_manager_class,
)
from kiln_capture.variables.functions import CallableObjectVariable
from kiln_capture.variables.native_context_managers import (
    NativeContextManagerVariable,
    is_native_context_manager,
)
from kiln_capture.variables.ops import apply_operator, contains, is_graph_value, sort_variables
from kiln_capture.variables.tensor import TensorVariable
from kiln_capture.variables.torchscript import type_argument

BUILTIN_HANDLERS: dict = {}

PURE_BUILTINS = {
    abs,
    all,
    any,
    bin,
    bool,
    callable,
    chr,
    complex,
    divmod,
    float,
    format,
    hex,
    int,
    len,
    max,
    min,
    oct,
    ord,
    pow,
    repr,
    round,
    sorted,
    str,
    sum,
    hash,
    isinstance,
    issubclass,
    tuple,
    frozenset,
    range,
    slice,
    type,
}


def is_pure_builtin(fn) -> bool:
    if type(fn) in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
        return True
    module = getattr(fn, "__module__", None)
    return (
        fn in BUILTIN_HANDLERS
        or module in ("math", "_operator", "operator")
        or (getattr(fn, "__self__", None) is math)
    )


def builtin(*fns):
    def register(handler):
        for fn in fns:
            BUILTIN_HANDLERS[fn] = handler
        return handler

    return register


class BuiltinVariable(CallableObjectVariable):
    """A builtin or pure standard-library function: applied by its handler or folded."""

    kind = "builtin"

    def call(self, tx, args, kwargs):
        getter = OPERATOR_OBJECTS.get(type(self.fn))
        if getter is not None:
            return getter(tx, self.fn, *args, **kwargs)
        handler = BUILTIN_HANDLERS.get(self.fn)
        if handler is not None:
            result = handler(tx, *args, **kwargs)
            if result is not None:
                return result
        if self.fn in PURE_BUILTINS or is_pure_builtin(self.fn):
            values = [python_value(a) for a in args]
            kw_values = {k: python_value(v) for k, v in kwargs.items()}
            if all(v is not None for v in [*values, *kw_values.values()]):
                value = tx.run_user_code(
                    self.fn, *(v[0] for v in values), **{k: v[0] for k, v in kw_values.items()}
                )
                return wrap_derived(tx, value)
        if getattr(self.fn, "__module__", None) in ("_operator", "operator") and not kwargs:
            return apply_operator(tx, self.fn, list(args))
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        raise GraphBreak(f"call to {name}, which capture cannot trace (a C function or I/O)")

    def getitem(self, tx, key):
        # ``list[int]``: a generic alias of a builtin class (``torch.jit.annotate``'s type)
        argument = type_argument(key)
        if isinstance(self.fn, type) and argument is not None:
            return wrap_derived(tx, tx.run_user_code(operator.getitem, self.fn, argument[0]))
        return super().getitem(tx, key)


def python_value(v: Variable):
    """A constant, or a list/tuple/dict/set of constants, as a fresh Python value (1-tuple)."""
    if v.is_constant():
        return (v.as_constant(),)
    if isinstance(v, SequenceVariable):
        items = [python_value(item) for item in v.items]
        if all(item is not None for item in items):
            return (
                v.python_cls([item[0] for item in items])
                if v.python_cls in (list, tuple)
                else None,
            )
    if isinstance(v, DictVariable):
        values = {k: python_value(val) for k, (_, val) in v.entries.items()}
        if all(val is not None for val in values.values()):
            return ({k: val[0] for k, val in values.items()},)
    return None


def _itemgetter(tx, getter, obj):
    keys = getter.__reduce__()[1]
    items = [obj.getitem(tx, ConstantVariable(k)) for k in keys]
    return items[0] if len(items) == 1 else TupleVariable(items)


def _attrgetter(tx, getter, obj):
    paths = getter.__reduce__()[1]
    values = []
    for path in paths:
        value = obj
        for part in path.split("."):
            value = value.getattr(tx, part)
        values.append(value)
    return values[0] if len(values) == 1 else TupleVariable(values)


def _methodcaller(tx, caller, obj):
    reduced = caller.__reduce__()
    if isinstance(reduced[0], functools.partial):  # keyword arguments
        name, *args = reduced[0].args
        kwargs = reduced[0].keywords
    else:
        name, *args = reduced[1]
        kwargs = {}
    return obj.call_method(
        tx,
        name,
        [wrap_derived(tx, a) for a in args],
        {k: wrap_derived(tx, v) for k, v in kwargs.items()},
    )


OPERATOR_OBJECTS = {
    operator.itemgetter: _itemgetter,
    operator.attrgetter: _attrgetter,
    operator.methodcaller: _methodcaller,
}


@builtin(functools.reduce)
def _reduce(tx, fn, iterable, *initial):
    items = iterable.unpack(tx)
    if initial:
        items = [initial[0], *items]
    if not items:
        raise UserError(TypeError("reduce() of empty iterable with no initial value"))
    result = items[0]
    for item in items[1:]:
        result = fn.call(tx, [result, item], {})
    return result


@builtin(itertools.accumulate)
def _accumulate(tx, iterable, func=None, *, initial=None):
    items = iterable.unpack(tx)
    if initial is not None and not (initial.is_constant() and initial.as_constant() is None):
        items = [initial, *items]
    sums = items[:1]
    for item in items[1:]:
        if func is None or (func.is_constant() and func.as_constant() is None):
            sums.append(apply_operator(tx, operator.add, [sums[-1], item]))
        else:
            sums.append(func.call(tx, [sums[-1], item], {}))
    return ListIteratorVariable(sums)


@builtin(itertools.repeat)
def _repeat(tx, obj, times=None):
    if times is None:
        raise GraphBreak("itertools.repeat() without a count repeats forever")
    return ListIteratorVariable([obj] * max(times.as_constant(), 0))


@builtin(copy.copy, copy.deepcopy)
def _copy(tx, obj, *memo):
    """Copies of plain objects are made for real; the original is then guarded by identity,
    since the copy depends on all of its attributes."""
    from kiln_capture.variables.objects import ModuleVariable, ObjectVariable

    if obj.is_constant():
        return obj
    if isinstance(obj, ObjectVariable) and not isinstance(obj, ModuleVariable) and not memo:
        if obj.source is not None:
            tx.output.guards.identity(obj.source, obj.value)
        from kiln_capture.variables.objects import ObjectVariable as Owned

        return Owned(tx.run_user_code(copy.deepcopy, obj.value), owned=True)
    if (
        isinstance(obj, (ListVariable, DictVariable, SetVariable))
        and not memo
        and (BUILTIN_HANDLERS.get(copy.copy) is not None)
    ):
        return obj.call_method(tx, "copy", [], {})
    raise GraphBreak(f"copying {obj.describe()}")


@builtin(operator.setitem)
def _setitem(tx, obj, key, value):
    tx.setitem(obj, key, value)
    return ConstantVariable(None)


@builtin(operator.delitem)
def _delitem(tx, obj, key):
    if is_graph_value(obj):
        return None
    obj.call_method(tx, "__delitem__", [key], {})
    return ConstantVariable(None)


def constant_args(*args) -> bool:
    return all(a.is_constant() for a in args)


@builtin(len)
def _len(tx, obj):
    if isinstance(obj, SequenceVariable):
        return ConstantVariable(len(obj.items))
    if isinstance(obj, (DictVariable,)):
        return ConstantVariable(len(obj.entries))
    if isinstance(obj, DictViewVariable):
        return ConstantVariable(len(obj.mapping.entries))
    if isinstance(obj, SetVariable):
        return ConstantVariable(len(obj.members))
    if obj.is_constant():
        return ConstantVariable(len(obj.as_constant()))
    from kiln_capture.variables.objects import ModuleVariable, ObjectVariable

    if isinstance(obj, ModuleVariable) or (isinstance(obj, ObjectVariable) and obj.source is None):
        return ConstantVariable(len(obj.value))
    return obj.call_method(tx, "__len__", [], {})


@builtin(isinstance)
def _isinstance(tx, obj, classes):
    cls = classes.as_constant() if classes.is_constant() else class_of(classes)
    return ConstantVariable(issubclass(obj.python_type(), cls))


def class_of(v: Variable):
    if isinstance(v, TupleVariable):
        return tuple(class_of(item) for item in v.items)
    value = getattr(v, "value", getattr(v, "fn", None))
    if isinstance(value, type):
        return value
    if v.is_constant() and isinstance(v.as_constant(), (type, tuple)):
        return v.as_constant()
    raise GraphBreak(f"isinstance() with {v.describe()} as the class")


@builtin(issubclass)
def _issubclass(tx, cls, classes):
    return ConstantVariable(issubclass(class_of(cls), class_of(classes)))


@builtin(type)
def _type(tx, obj, *rest):
    if rest:
        return None
    from kiln_capture.variables.objects import ClassVariable

    return ClassVariable(obj.python_type())


@builtin(range)
def _range(tx, *args):
    from kiln_capture.variables.tensor import SymNodeVariable

    args = [a.specialized() if isinstance(a, SymNodeVariable) else a for a in args]
    if constant_args(*args):
        return ConstantVariable(range(*(a.as_constant() for a in args)))
    raise GraphBreak("range() over a symbolic size")


@builtin(enumerate)
def _enumerate(tx, iterable, start=None):
    first = start.as_constant() if start is not None else 0
    items = iterable.unpack(tx)
    return ListIteratorVariable(
        [TupleVariable([ConstantVariable(first + i), v]) for i, v in enumerate(items)]
    )


@builtin(zip)
def _zip(tx, *iterables, strict=None):
    columns = [it.unpack(tx) for it in iterables]
    if strict is not None and strict.as_constant() and len({len(c) for c in columns}) > 1:
        raise UserError(ValueError("zip() arguments have different lengths"))
    return ListIteratorVariable([TupleVariable(list(row)) for row in zip(*columns, strict=False)])


@builtin(map)
def _map(tx, fn, *iterables):
    columns = [it.unpack(tx) for it in iterables]
    return ListIteratorVariable([fn.call(tx, list(row), {}) for row in zip(*columns, strict=False)])


@builtin(filter)
def _filter(tx, fn, iterable):
    items = iterable.unpack(tx)
    if fn.is_constant() and fn.as_constant() is None:
        return ListIteratorVariable([v for v in items if v.truthy(tx)])
    return ListIteratorVariable([v for v in items if fn.call(tx, [v], {}).truthy(tx)])


@builtin(reversed)
def _reversed(tx, seq):
    return ListIteratorVariable(list(reversed(seq.unpack(tx))))


@builtin(iter)
def _iter(tx, obj, *rest):
    if rest:
        return None
    if isinstance(obj, ListIteratorVariable):
        return obj
    return ListIteratorVariable(obj.unpack(tx))


@builtin(next)
def _next(tx, it, default=None):
    if isinstance(it, ListIteratorVariable):
        item = it.next(tx)
        if item is not None:
            return item
        if default is not None:
            return default
        raise UserError(StopIteration())
    return it.call_method(tx, "__next__", [], {})


@builtin(list)
def _list(tx, iterable=None):
    return ListVariable(iterable.unpack(tx) if iterable is not None else [])


@builtin(tuple)
def _tuple(tx, iterable=None):
    return TupleVariable(iterable.unpack(tx) if iterable is not None else [])


@builtin(set)
def _set(tx, iterable=None):
    return SetVariable(iterable.unpack(tx) if iterable is not None else [])


@builtin(frozenset)
def _frozenset(tx, iterable=None):
    return SetVariable(iterable.unpack(tx) if iterable is not None else [], cls=frozenset)


@builtin(dict)
def _dict(tx, source=None, **kwargs):
    return DictVariable.from_pairs(tx, mapping_pairs(tx, source, kwargs))


@builtin(sorted)
def _sorted(tx, iterable, key=None, reverse=None):
    flag = reverse.as_constant() if reverse is not None else False
    return ListVariable(sort_variables(tx, iterable.unpack(tx), key, flag))


@builtin(sum)
def _sum(tx, iterable, start=None):
    total = start if start is not None else ConstantVariable(0)
    for item in iterable.unpack(tx):
        total = apply_operator(tx, operator.add, [total, item])
    return total


def _extreme(pick, name):
    def handler(tx, *args, key=None, default=None):
        items = args[0].unpack(tx) if len(args) == 1 else list(args)
        if not items:
            if default is not None:
                return default
            raise UserError(ValueError(f"{name}() arg is an empty sequence"))
        if key is None and all(v.is_constant() for v in items):
            return ConstantVariable(pick(v.as_constant() for v in items))
        if key is not None:
            keyed = [(key.call(tx, [v], {}).as_constant(), v) for v in items]
            return pick(keyed, key=lambda pair: pair[0])[1]
        if any(isinstance(v, TensorVariable) for v in items):
            if _one_element_alike(items):
                return _pick_tensor(tx, items, operator.gt if pick is max else operator.lt)
            raise GraphBreak(f"{name}() over tensors compares their values")
        sym = torch.sym_max if pick is max else torch.sym_min
        result = items[0]
        for item in items[1:]:
            result = tx.output.call_graph("call_function", sym, [result, item], {})
        return result

    return handler


def _one_element_alike(items) -> bool:
    """Tensors of one element, of one shape and dtype (static), and subclasses of none."""
    if not all(isinstance(v, TensorVariable) and v.cls is torch.Tensor for v in items):
        return False
    first = items[0].example
    return (
        all(
            v.example.shape == first.shape
            and v.example.dtype == first.dtype
            and not any(isinstance(n, torch.SymInt) for n in v.example.shape)
            for v in items
        )
        and first.numel() == 1
    )


def _pick_tensor(tx, items, beats):
    """Python's ``max``/``min`` of one-element tensors as graph ops: keep the current one
    unless the next compares ``beats`` it (the first of equal ones, NaN as Python keeps it)."""
    result = items[0]
    for item in items[1:]:
        better = apply_operator(tx, beats, [item, result])
        result = tx.output.call_graph("call_function", torch.where, [better, item, result], {})
    return result


BUILTIN_HANDLERS[max] = _extreme(max, "max")
BUILTIN_HANDLERS[min] = _extreme(min, "min")


@builtin(abs)
def _abs(tx, x):
    from kiln_capture.variables.ndarray import NumpyArrayVariable

    if isinstance(x, NumpyArrayVariable):
        return apply_operator(tx, operator.abs, [x])
    if is_graph_value(x):
        return tx.output.call_graph("call_function", operator.abs, [x], {})
    return None


@builtin(any)
def _any(tx, iterable):
    return ConstantVariable(any(item.truthy(tx) for item in iterable.unpack(tx)))


@builtin(all)
def _all(tx, iterable):
    return ConstantVariable(all(item.truthy(tx) for item in iterable.unpack(tx)))


@builtin(getattr)
def _getattr(tx, obj, name, default=None):
    try:
        return obj.getattr(tx, name.as_constant())
    except UserError as err:
        if default is not None and isinstance(err.exc, AttributeError):
            return default
        raise


@builtin(delattr)
def _delattr(tx, obj, name):
    deleter = getattr(obj, "delattr", None)
    if deleter is None:
        raise GraphBreak(f"deleting attribute {name.as_constant()!r} of {obj.describe()}")
    return deleter(tx, name.as_constant())


@builtin(hasattr)
def _hasattr(tx, obj, name):
    try:
        obj.getattr(tx, name.as_constant())
    except UserError as err:
        if isinstance(err.exc, AttributeError):
            return ConstantVariable(False)
        raise
    return ConstantVariable(True)


@builtin(setattr)
def _setattr(tx, obj, name, value):
    tx.store_attr(obj, name.as_constant(), value)
    return ConstantVariable(None)


@builtin(callable)
def _callable(tx, obj):
    from kiln_capture.variables.functions import (
        BaseFunctionVariable,
        BoundMethodVariable,
        TorchFunctionVariable,
    )

    if isinstance(
        obj, (BaseFunctionVariable, BoundMethodVariable, TorchFunctionVariable, BuiltinVariable)
    ):
        return ConstantVariable(True)
    if obj.is_constant():
        return ConstantVariable(callable(obj.as_constant()))
    # an instance is callable when its class (not its metaclass) defines __call__
    return ConstantVariable(
        any("__call__" in klass.__dict__ for klass in obj.python_type().__mro__)
    )


@builtin(bool)
def _bool(tx, x=None):
    if x is None:
        return ConstantVariable(False)
    return ConstantVariable(x.truthy(tx))


def number(cls: type):
    def handler(tx, x=None, *rest):
        from kiln_capture.variables.tensor import SymNodeVariable

        if isinstance(x, SymNodeVariable) and not rest:
            return sym_math.to_number(tx, cls, x)
        if x is not None and is_graph_value(x):
            raise GraphBreak("converting a tensor to a Python number")
        return None

    return handler


builtin(int)(number(int))
builtin(float)(number(float))


@builtin(str, repr)
def _str(tx, obj=None, *rest):
    from kiln_capture.variables.objects import ExceptionVariable

    if isinstance(obj, ExceptionVariable) and not rest:
        return ConstantVariable(str(obj.exc))
    value = getattr(obj, "value", None)
    if (
        obj is not None
        and not rest
        and not obj.is_constant()
        and isinstance(value, (type, types.FunctionType, types.ModuleType))
    ):
        return ConstantVariable(str(value))
    return None


@builtin(print)
def _print(tx, *args, **kwargs):
    raise GraphBreak("print() (I/O)")


@builtin(id)
def _id(tx, obj):
    raise GraphBreak("id()")


@builtin(operator.contains)
def _contains(tx, container, item):
    return ConstantVariable(contains(tx, container, item))


@builtin(super)
def _super(tx, *args):
    from kiln_capture.variables.objects import SuperVariable

    if len(args) == 2:
        return SuperVariable(class_of(args[0]), args[1])
    return tx.zero_arg_super()


def call_constructor(tx, cls: type, args, kwargs):
    """Calling a class during capture."""
    from kiln_capture.variables.objects import DataclassVariable, ExceptionVariable, make_namedtuple
    from kiln_capture.variables.torch_calls import CONTEXT_MANAGERS

    if cls in CONTEXT_MANAGERS:
        return CONTEXT_MANAGERS[cls](tx, *args, **kwargs)
    if is_native_context_manager(cls):  # a profiler's: made and entered for real at its with
        return NativeContextManagerVariable(cls, list(args), dict(kwargs))
    if is_generator_context_manager_class(cls) and len(args) == 3 and not kwargs:
        func, positional, keywords = args
        return GeneratorContextManagerVariable(
            func, positional.unpack(tx), {k: v for k, (_, v) in keywords.entries.items()}
        )
    handler = BUILTIN_HANDLERS.get(cls)
    if handler is not None:
        result = handler(tx, *args, **kwargs)
        if result is not None:
            return result
    if cls is functools.partial:
        from kiln_capture.variables.objects import PartialVariable

        return PartialVariable.of(args[0], args[1:], kwargs)
    if issubclass(cls, BaseException):
        values = [a.as_constant() for a in args]
        return ExceptionVariable(cls(*values, **{k: v.as_constant() for k, v in kwargs.items()}))
    if is_namedtuple_class(cls):
        return make_namedtuple(tx, cls, args, kwargs)
    if dataclasses.is_dataclass(cls):
        return build_dataclass(tx, cls, args, kwargs, DataclassVariable)
    if cls is torch.Size:
        return make_size(tx, args, kwargs)
    if (
        all(a.is_constant() for a in args)
        and all(v.is_constant() for v in kwargs.values())
        and (cls in PURE_BUILTINS or cls.__module__ in ("builtins", "torch", "math"))
    ):
        return wrap_derived(
            tx,
            tx.run_user_code(
                cls,
                *(a.as_constant() for a in args),
                **{k: v.as_constant() for k, v in kwargs.items()},
            ),
        )
    from kiln_capture.variables.objects import NewObjectVariable, can_build_symbolically

    if can_build_symbolically(cls):
        obj = NewObjectVariable(cls)
        if cls.__init__ is not object.__init__:
            from kiln_capture.variables.functions import UserFunctionVariable

            UserFunctionVariable(cls.__init__).call(tx, [obj, *args], kwargs)
        elif args or kwargs:
            raise UserError(TypeError(f"{cls.__name__}() takes no arguments"))
        return obj
    if is_stateless_torch_module(cls, args, kwargs):
        return build_stateless_module(tx, cls, args, kwargs)
    raise GraphBreak(f"constructing a {cls.__qualname__} object")


def make_size(tx, args, kwargs):
    """``torch.Size(sizes)`` of ints or symbolic ints (``torch.Size([1])`` in torch's own
    Python code, ``torch.Size(shape)`` of a list built during capture)."""
    from kiln_capture.variables.containers import SizeVariable
    from kiln_capture.variables.tensor import SymNodeVariable

    if kwargs or len(args) > 1:
        raise GraphBreak("torch.Size() with these arguments")
    items = args[0].unpack(tx) if args else []
    for item in items:
        if not isinstance(item, SymNodeVariable) and type(item.as_constant()) is not int:
            return wrap_derived(tx, tx.run_user_code(torch.Size, [i.as_constant() for i in items]))
    return SizeVariable(list(items))


def is_stateless_torch_module(cls: type, args, kwargs) -> bool:
    """A module class of ``torch.nn`` (a loss, an activation, dropout) called with constant
    arguments only: built at capture time, it holds no tensor the graph would need."""
    return (
        issubclass(cls, torch.nn.Module)
        and cls.__module__.startswith("torch.nn.modules.")
        and all(a.is_constant() for a in args)
        and all(v.is_constant() for v in kwargs.values())
    )


def build_stateless_module(tx, cls: type, args, kwargs):
    from kiln_capture.variables.objects import ModuleVariable

    module = tx.run_user_code(
        cls, *(a.as_constant() for a in args), **{k: v.as_constant() for k, v in kwargs.items()}
    )
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise GraphBreak(f"constructing a {cls.__qualname__} object with parameters or buffers")
    return ModuleVariable(module, None, owned=True)


def build_dataclass(tx, cls, args, kwargs, variable_cls):
    fields = [f for f in dataclasses.fields(cls) if f.init]
    values: dict[str, Variable] = {}
    for field, arg in zip(fields, args, strict=False):
        values[field.name] = arg
    for name, arg in kwargs.items():
        if name not in {f.name for f in fields}:
            raise UserError(
                TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument {name!r}")
            )
        values[name] = arg
    for field in fields:
        if field.name in values:
            continue
        if field.default is not dataclasses.MISSING:
            values[field.name] = wrap_derived(tx, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            values[field.name] = wrap_derived(tx, field.default_factory())
        else:
            raise UserError(
                TypeError(
                    f"{cls.__name__}.__init__() missing 1 required positional "
                    f"argument: {field.name!r}"
                )
            )
    has_post_init = hasattr(cls, "__post_init__")
    if has_post_init and not _is_model_output(cls):
        raise GraphBreak(f"dataclass {cls.__name__} with __post_init__")
    return variable_cls(cls, values)


def _is_model_output(cls) -> bool:
    return any(base.__name__ == "ModelOutput" for base in cls.__mro__)


__all__ = ["BuiltinVariable", "builtins", "call_constructor", "is_pure_builtin"]


from kiln_capture.variables import sym_math  # noqa: E402 - registers its handlers
