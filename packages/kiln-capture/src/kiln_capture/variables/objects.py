"""Objects: nn.Modules, Python modules, classes, user objects, dataclasses and exceptions."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import re
import types

import torch
from torch.nn.modules.module import (
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.module_calls import has_own_hooks, runs_wrapped_module
from kiln_capture.sources import AttrSource, ItemSource, ModuleMemberSource
from kiln_capture.variables.base import Variable
from kiln_capture.variables.builder import dict_key, is_namedtuple_class, wrap, wrap_derived
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import DictVariable, NamedTupleVariable, TupleVariable
from kiln_capture.variables.functions import BoundMethodVariable, UserFunctionVariable
from kiln_capture.variables.module_walks import MODULE_INTROSPECTION, MODULE_WALKS
from kiln_capture.variables.torchscript import is_typing_form, subscript_typing_form


def bind_class_attribute(tx, static, instance: Variable, cls: type):
    """A class attribute looked up on ``instance``: a method is bound, a property is run, a
    static or class method is unwrapped. ``None`` when ``static`` is none of these."""
    if isinstance(static, types.FunctionType):
        return BoundMethodVariable(UserFunctionVariable(static), instance)
    if isinstance(static, property) and static.fget is not None:
        return UserFunctionVariable(static.fget).call(tx, [instance], {})
    if isinstance(static, staticmethod):
        return wrap_derived(tx, static.__func__)
    if isinstance(static, classmethod):
        return BoundMethodVariable(UserFunctionVariable(static.__func__), ClassVariable(cls))
    return None


class ObjectVariable(Variable):
    """A Python object from outside the frame, read through its attributes.

    An ``owned`` object was made during capture (a copy): nobody else sees it, so changes
    to it are made to the object itself, and it is copied again for each call if it
    escapes."""

    mutable = True

    def __init__(self, value, source=None, owned: bool = False):
        self.value = value
        self.source = source
        self.owned = owned

    def python_type(self):
        return type(self.value)

    def describe(self) -> str:
        return f"a {type(self.value).__name__} object"

    def identity_key(self):
        return ("object", id(self.value))

    def getattr(self, tx, name):
        pending = tx.side_effects.pending_attr(self, name)
        if pending is not None:
            return pending
        custom = self.custom_getattribute()
        if custom is None:
            return self.read_attr(tx, name)
        # the class's own __getattribute__ (a Hugging Face config's) would run at each read
        # in the guards: traced, the guards check what it reads instead (the instance dict,
        # the class's tables), past it
        try:
            return UserFunctionVariable(custom).call(tx, [self, ConstantVariable(name)], {})
        except GraphBreak:
            return self.read_plain_attr(tx, name)  # guarded through __getattribute__

    def read_attr(self, tx, name):
        """``object.__getattribute__(value, name)``."""
        if self.custom_getattribute() is not None:
            return self.read_generic_attr(tx, name)
        return self.read_plain_attr(tx, name)

    def custom_getattribute(self):
        """The class's own ``__getattribute__``, where guards read past it: a plain object
        read from a source whose class has one written in Python."""
        if type(self) is not ObjectVariable or self.source is None:
            return None
        found = getattr(type(self.value), "__getattribute__", None)
        return found if isinstance(found, types.FunctionType) else None

    def read_plain_attr(self, tx, name):
        """``value.name``, guarded as read."""
        value = self.value
        try:
            static = inspect.getattr_static(value, name)
        except AttributeError:
            static = None
        if isinstance(
            static, (types.MethodDescriptorType, types.WrapperDescriptorType)
        ) and isinstance(value, dict):
            from kiln_capture.variables.base import MethodVariable

            return MethodVariable(self, name)
        if name not in getattr(value, "__dict__", {}):
            bound = bind_class_attribute(tx, static, self, type(value))
            if bound is not None:
                return bound
        try:
            attr = getattr(value, name)
        except AttributeError as exc:
            raise UserError(exc) from None
        source = AttrSource(self.source, name) if self.source is not None else None
        return wrap(tx, attr, source)

    def read_generic_attr(self, tx, name):
        """``object.__getattribute__(value, name)`` of an object whose class has its own
        ``__getattribute__``: its instance dict, a method or property of its class, or an
        instance or class attribute, guarded as read past that ``__getattribute__``."""
        from kiln_capture.sources import GenericAttrSource

        value = self.value
        source = GenericAttrSource(self.source, name)
        if name == "__dict__":
            known = tx.output.wrapped.get(source)
            if known is None:
                try:
                    attributes = object.__getattribute__(value, "__dict__")
                except AttributeError as exc:  # a class with __slots__ only
                    raise UserError(exc) from None
                tx.output.guards.type(source, attributes)
                known = tx.output.wrapped[source] = InstanceDictVariable(attributes, source)
            return known
        try:
            in_instance = name in object.__getattribute__(value, "__dict__")
        except AttributeError:  # a class with __slots__ only
            in_instance = False
        if not in_instance:
            static = inspect.getattr_static(value, name, None)
            bound = bind_class_attribute(tx, static, self, type(value))
            if bound is not None:
                return bound
        try:
            attr = object.__getattribute__(value, name)
        except AttributeError as exc:
            raise UserError(exc) from None
        return wrap(tx, attr, source)

    def getitem(self, tx, key):
        if is_typing_form(self.value):
            made = subscript_typing_form(tx, self.value, key)
            if made is not None:
                return made
        return super().getitem(tx, key)

    def call_method(self, tx, name, args, kwargs):
        if self.source is None:
            # an object computed during capture by pure code: its methods run for real
            from kiln_capture.variables.functions import real_value

            reals = [real_value(a) for a in args]
            kw_reals = {k: real_value(v) for k, v in kwargs.items()}
            if all(r is not None for r in [*reals, *kw_reals.values()]):
                method = tx.run_user_code(getattr, self.value, name)
                result = tx.run_user_code(
                    method, *(r[0] for r in reals), **{k: r[0] for k, r in kw_reals.items()}
                )
                return wrap_derived(tx, result)
        if name == "__getitem__" and args and args[0].is_constant():
            key = args[0].as_constant()
            item = tx.run_user_code(self.value.__getitem__, key)
            source = ItemSource(self.source, key) if self.source is not None else None
            return wrap(tx, item, source)
        if name == "__setattr__":
            return self.setattr(tx, args[0].as_constant(), args[1])
        if name == "__contains__" and args[0].is_constant():
            return ConstantVariable(
                tx.run_user_code(self.value.__contains__, args[0].as_constant())
            )
        if name == "__len__" and isinstance(self.value, dict):
            return ConstantVariable(len(self.value))
        if isinstance(self.value, dict) and name in ("keys", "values", "items", "get"):
            return self.as_dict(tx).call_method(tx, name, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def as_dict(self, tx) -> DictVariable:
        source = self.source
        entries = {}
        for k, v in self.value.items():
            entry_key, key_var = dict_key(tx, k)
            entries[entry_key] = (key_var, wrap(tx, v, ItemSource(source, k) if source else None))
        return DictVariable(entries)

    def setattr(self, tx, name: str, value: Variable):
        if self.owned:
            from kiln_capture.variables.functions import real_value

            real = real_value(value)
            if real is None:
                raise GraphBreak(f"storing {value.describe()} on {self.describe()}")
            tx.run_user_code(setattr, self.value, name, real[0])
            return ConstantVariable(None)
        if self.source is None:
            raise GraphBreak(f"setting attribute {name!r} on {self.describe()}")
        tx.side_effects.store_attr(self, name, value)
        return ConstantVariable(None)

    def delattr(self, tx, name: str):
        if not self.owned:
            raise GraphBreak(f"deleting attribute {name!r} of {self.describe()}")
        tx.run_user_code(delattr, self.value, name)
        return ConstantVariable(None)

    def truthy(self, tx) -> bool:
        kind = type(self.value)
        if getattr(kind, "__bool__", None) is None and getattr(kind, "__len__", None) is None:
            return True
        raise GraphBreak(f"truth value of {self.describe()}")

    def unpack(self, tx):
        if isinstance(self.value, dict):
            return [ConstantVariable(k) for k in self.value]
        return super().unpack(tx)

    def reconstruct(self, cg):
        if self.source is not None:
            return self.source.emit(cg)
        if self.owned:  # each call gets its own copy, as eagerly
            cg.call_object(copy.deepcopy, [ConstantVariable(self.value)])
            return
        cg.load_const(self.value)


class ModuleVariable(ObjectVariable):
    """An ``nn.Module``: its parameters and buffers become graph inputs, ``forward`` is inlined."""

    def describe(self) -> str:
        return f"module {type(self.value).__name__}"

    def read_attr(self, tx, name):
        module = self.value
        if name in MODULE_INTROSPECTION and name not in module.__dict__:
            from kiln_capture.variables.base import MethodVariable

            return MethodVariable(self, name)
        for registry in ("_parameters", "_buffers", "_modules"):
            members = module.__dict__.get(registry)
            if members is not None and name in members:
                if members[name] is None:
                    return ConstantVariable(None)
                source = ModuleMemberSource(self.source, registry, name) if self.source else None
                if source is None:
                    raise GraphBreak(f"{registry[1:-1]} {name!r} of a module built during capture")
                return wrap(tx, members[name], source)
        return super().read_attr(tx, name)

    def call(self, tx, args, kwargs):
        module = self.value
        if has_hooks(module):
            raise GraphBreak(
                f"calling {type(module).__name__} with hooks registered (they run as they "
                "are, around its captured forward)"
            )
        if runs_wrapped_module(module):
            raise GraphBreak(
                f"{type(module).__name__} runs as it is, around the module it wraps, captured"
            )
        forward = type(module).forward
        if isinstance(forward, types.FunctionType):
            return UserFunctionVariable(forward).call(tx, [self, *args], kwargs)
        raise GraphBreak(f"forward of {type(module).__name__} is not a Python function")

    def call_method(self, tx, name, args, kwargs):
        walker = MODULE_WALKS.get(name)
        if walker is not None and all(a.is_constant() for a in [*args, *kwargs.values()]):
            from kiln_capture.variables.containers import ListIteratorVariable

            options = {k: v.as_constant() for k, v in kwargs.items()}
            return ListIteratorVariable(
                walker(self, tx, *(a.as_constant() for a in args), **options)
            )
        if name in MODULE_INTROSPECTION:
            raise GraphBreak(f"Module.{name}() inside captured code")
        return super().call_method(tx, name, args, kwargs)

    def members(self, tx, registry: str, prefix: str, recurse: bool):
        """(qualified name, variable) of each parameter/buffer/submodule, with sources."""
        found = []
        for key, value in self.value.__dict__[registry].items():
            if value is not None:
                source = ModuleMemberSource(self.source, registry, key)
                found.append((prefix + key, wrap(tx, value, source)))
        if recurse and registry != "_modules":
            for key, child in self.value._modules.items():
                if child is not None:
                    child_var = self.read_attr(tx, key)
                    found += child_var.members(tx, registry, f"{prefix}{key}.", True)
        return found

    def unpack(self, tx):
        module = self.value
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            return [self.read_attr(tx, key) for key in module._modules]
        if isinstance(module, torch.nn.ModuleDict):
            return [ConstantVariable(key) for key in module._modules]
        return super().unpack(tx)

    def getitem(self, tx, key):
        module = self.value
        index = key.as_constant()
        if isinstance(module, torch.nn.ModuleDict):
            return self.read_attr(tx, index)
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            keys = list(module._modules)
            if isinstance(index, slice):
                return TupleVariable([self.read_attr(tx, k) for k in keys[index]])
            try:
                return self.read_attr(tx, keys[index])
            except IndexError as exc:
                raise UserError(exc) from None
        return super().getitem(tx, key)


def has_hooks(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs hooks (its own or global ones). Called at every call
    of a captured module: the reads are written out."""
    return bool(
        has_own_hooks(module)
        or _global_forward_hooks
        or _global_forward_pre_hooks
        or _global_backward_hooks
        or _global_backward_pre_hooks
    )


class PythonModuleVariable(ObjectVariable):
    def describe(self) -> str:
        return f"module {self.value.__name__}"

    def read_attr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as exc:
            raise UserError(exc) from None
        source = AttrSource(self.source, name) if self.source is not None else None
        return wrap(tx, attr, source)


class ClassVariable(ObjectVariable):
    """A class: calling it builds a dataclass, NamedTuple, exception or dict subclass."""

    def describe(self) -> str:
        return f"class {self.value.__qualname__}"

    def call(self, tx, args, kwargs):
        from kiln_capture.variables.builtin_calls import call_constructor

        return call_constructor(tx, self.value, args, kwargs)

    def read_attr(self, tx, name):
        static = inspect.getattr_static(self.value, name, None)
        if isinstance(static, (staticmethod,)):
            return wrap_derived(tx, static.__func__)
        if isinstance(static, classmethod):
            return BoundMethodVariable(UserFunctionVariable(static.__func__), self)
        if isinstance(static, types.FunctionType):
            return UserFunctionVariable(static)
        return super().read_attr(tx, name)


class DataclassVariable(Variable):
    """An instance of a dataclass (Hugging Face's ModelOutput included) made during capture."""

    mutable = True

    def __init__(self, cls: type, fields: dict[str, Variable]):
        self.cls = cls
        self.fields = dict(fields)

    def python_type(self):
        return self.cls

    def describe(self) -> str:
        return f"a {self.cls.__name__}"

    def is_mapping(self) -> bool:
        return issubclass(self.cls, dict)

    def present(self) -> list[tuple[str, Variable]]:
        """The (key, value) pairs a ModelOutput-style dict exposes: fields that are not None."""
        return [
            (k, v)
            for k, v in self.fields.items()
            if not (v.is_constant() and v.as_constant() is None)
        ]

    def getattr(self, tx, name):
        if name in self.fields:
            return self.fields[name]
        static = inspect.getattr_static(self.cls, name, None)
        bound = bind_class_attribute(tx, static, self, self.cls)
        if bound is not None:
            return bound
        raise GraphBreak(f"attribute {name!r} of {self.describe()}")

    def getitem(self, tx, key):
        index = key.as_constant()
        if isinstance(index, str):
            entries = dict(self.present()) if self.is_mapping() else self.fields
            if index not in entries:
                raise UserError(KeyError(index))
            return entries[index]
        values = [v for _, v in self.present()]
        if isinstance(index, slice):
            return TupleVariable(values[index])
        return values[index]

    def call_method(self, tx, name, args, kwargs):
        if name == "to_tuple":
            return TupleVariable([v for _, v in self.present()])
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if self.is_mapping() and name in (
            "keys",
            "values",
            "items",
            "get",
            "__contains__",
            "__len__",
        ):
            mapping = DictVariable.from_pairs(
                tx, [(ConstantVariable(k), v) for k, v in self.present()]
            )
            return mapping.call_method(tx, name, args, kwargs)
        if name == "__setattr__" or name == "__setitem__":
            key = args[0].as_constant()
            self.fields[key] = args[1]
            return ConstantVariable(None)
        return super().call_method(tx, name, args, kwargs)

    def setattr(self, tx, name, value):
        self.fields[name] = value
        return ConstantVariable(None)

    def unpack(self, tx):
        if self.is_mapping():
            return [ConstantVariable(k) for k, _ in self.present()]
        return super().unpack(tx)

    def reconstruct(self, cg):
        from kiln_capture.model_outputs import model_output_builder
        from kiln_capture.variables.tensor import TensorVariable

        builder = model_output_builder(
            self.cls, self.fields, lambda v: isinstance(v, TensorVariable)
        )
        if builder is not None:  # a Hugging Face output of tensors: built directly
            cg.call_object(builder, [self.fields[name] for name in builder.present])
            return
        init_fields = [f.name for f in dataclasses.fields(self.cls) if f.init]
        names = [n for n in init_fields if n in self.fields]
        cg.call_object(self.cls, [self.fields[n] for n in names], kw_names=tuple(names))


class ExceptionVariable(Variable):
    """An exception object made by the user's code during capture, or one from outside
    the frame (``source``: a resume function's exception handler gets it), guarded by
    type and read as an object."""

    def __init__(self, exc: BaseException, source=None):
        self.exc = exc
        self.source = source

    def python_type(self):
        return type(self.exc)

    def describe(self) -> str:
        return f"{type(self.exc).__name__}({self.exc})"

    def getattr(self, tx, name):
        if self.source is not None:
            return ObjectVariable(self.exc, self.source).getattr(tx, name)
        if name == "args":
            return wrap_derived(tx, self.exc.args)
        return wrap_derived(tx, getattr(self.exc, name))


class PartialVariable(Variable):
    def __init__(self, value: functools.partial, source, tx):
        self.func = wrap_derived(tx, value.func)
        self.args = [wrap_derived(tx, a) for a in value.args]
        self.keywords = {k: wrap_derived(tx, v) for k, v in value.keywords.items()}
        self.source = source

    @classmethod
    def of(cls, func: Variable, args, keywords):
        partial = cls.__new__(cls)
        partial.func, partial.args, partial.keywords = func, list(args), dict(keywords)
        partial.source = None
        return partial

    def describe(self) -> str:
        return "a functools.partial"

    def call(self, tx, args, kwargs):
        return self.func.call(tx, [*self.args, *args], {**self.keywords, **kwargs})


class SuperVariable(Variable):
    """``super()`` inside a method: attribute lookup starts after ``cls`` in the MRO."""

    def __init__(self, cls: type, obj: Variable):
        self.cls = cls
        self.obj = obj

    def describe(self) -> str:
        return f"super({self.cls.__name__})"

    def getattr(self, tx, name):
        mro = self.obj.python_type().__mro__
        for klass in mro[mro.index(self.cls) + 1 :]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return BoundMethodVariable(UserFunctionVariable(attr), self.obj)
                if isinstance(attr, classmethod):
                    return BoundMethodVariable(
                        UserFunctionVariable(attr.__func__), ClassVariable(self.obj.python_type())
                    )
                if attr is object.__init__:
                    return ConstantVariable(None)
                if attr is object.__getattribute__ and hasattr(self.obj, "read_attr"):
                    return ReadAttrVariable(self.obj)
                if (
                    name in READ_ONLY_METHODS
                    and hasattr(self.obj, "value")
                    and isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType))
                ):
                    return RealMethodVariable(attr, self.obj)
                raise GraphBreak(f"super().{name} of kind {type(attr).__name__}")
        raise UserError(AttributeError(f"'super' object has no attribute {name!r}"))


# Methods of builtin containers that only read: called on the real object at capture time.
READ_ONLY_METHODS = {
    "get",
    "__getitem__",
    "__contains__",
    "keys",
    "values",
    "items",
    "__len__",
    "copy",
    "index",
    "count",
    "__eq__",
    "__ne__",
}


class RealMethodVariable(Variable):
    """A read-only builtin method applied to a real object (``super().get(key)`` on a dict
    subclass): called during capture with constant arguments."""

    def __init__(self, method, obj: Variable):
        self.method = method
        self.obj = obj

    def describe(self) -> str:
        return f"{self.method.__qualname__} of {self.obj.describe()}"

    def call(self, tx, args, kwargs):
        if not all(a.is_constant() for a in args) or kwargs:
            raise GraphBreak(f"{self.describe()} with non-constant arguments")
        result = tx.run_user_code(self.method, self.obj.value, *(a.as_constant() for a in args))
        return wrap_derived(tx, result)


class InstanceDictVariable(Variable):
    """An object's instance dict read past its class's ``__getattribute__``, looked up by
    constant keys: a key present is guarded as any value, a key absent by ``not in``."""

    def __init__(self, value: dict, source):
        self.value = value
        self.source = source

    def python_type(self):
        return dict

    def has(self, tx, name) -> bool:
        found = name in self.value
        expr = tx.output.guards.bind(self.source)
        check = f"{name!r} {'in' if found else 'not in'} {expr}"
        tx.output.guards.add(check, f"{expr} {'has' if found else 'has no'} {name!r}")
        return found

    def lookup(self, tx, key, default: Variable | None):
        from kiln_capture.sources import ItemSource

        name = key.as_constant()
        if name in self.value:
            return wrap(tx, self.value[name], ItemSource(self.source, name))
        self.has(tx, name)
        if default is None:
            raise UserError(KeyError(name))
        return default

    def call_method(self, tx, name, args, kwargs):
        if name == "get" and not kwargs and len(args) in (1, 2) and args[0].is_constant():
            return self.lookup(tx, args[0], args[1] if len(args) == 2 else ConstantVariable(None))
        if name == "__getitem__" and args[0].is_constant():
            return self.lookup(tx, args[0], None)
        if name == "__contains__" and args[0].is_constant():
            return ConstantVariable(self.has(tx, args[0].as_constant()))
        raise GraphBreak(f"method {name}() of an instance dict")


class ReadAttrVariable(Variable):
    """``super().__getattribute__`` of an object: a plain attribute read."""

    def __init__(self, obj):
        self.obj = obj

    def call(self, tx, args, kwargs):
        return self.obj.read_attr(tx, args[0].as_constant())


def make_namedtuple(tx, cls, args, kwargs):
    bound = inspect.signature(cls).bind(*args, **kwargs)
    bound.apply_defaults()
    return NamedTupleVariable([wrap_derived(tx, v) for v in bound.arguments.values()], cls)


__all__ = [
    "ClassVariable",
    "DataclassVariable",
    "ExceptionVariable",
    "ModuleVariable",
    "ObjectVariable",
    "PartialVariable",
    "PythonModuleVariable",
    "SuperVariable",
    "is_namedtuple_class",
    "make_namedtuple",
]


class NewObjectVariable(Variable):
    """An instance of a plain Python class created during capture: ``__init__`` is
    inlined, attributes are tracked, and it is rebuilt after the graph if it escapes."""

    mutable = True

    def __init__(self, cls: type):
        self.cls = cls
        self.attrs: dict[str, Variable] = {}

    def python_type(self):
        return self.cls

    def describe(self) -> str:
        return f"a new {self.cls.__qualname__}"

    def identity_key(self):
        return ("new", id(self))

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return ClassVariable(self.cls)
        static = inspect.getattr_static(self.cls, name, _MISSING)
        if static is _MISSING:
            getattr_hook = inspect.getattr_static(self.cls, "__getattr__", None)
            if isinstance(getattr_hook, types.FunctionType):
                return UserFunctionVariable(getattr_hook).call(
                    tx, [self, ConstantVariable(name)], {}
                )
            raise UserError(
                AttributeError(f"'{self.cls.__name__}' object has no attribute {name!r}")
            )
        bound = bind_class_attribute(tx, static, self, self.cls)
        if bound is not None:
            return bound
        if hasattr(static, "__get__") and not isinstance(static, (int, float, str, tuple)):
            raise GraphBreak(f"descriptor {name!r} of {self.cls.__qualname__}")
        # a class attribute: read (and guarded) through the class, which may change it
        from kiln_capture.sources import ObjectSource

        label = re.sub(r"\W", "_", f"class_{self.cls.__module__}_{self.cls.__qualname__}")
        return wrap(tx, static, AttrSource(ObjectSource(self.cls, label), name))

    def setattr(self, tx, name, value):
        self.attrs[name] = value
        return ConstantVariable(None)

    def call(self, tx, args, kwargs):
        return self.getattr(tx, "__call__").call(tx, args, kwargs)

    def call_method(self, tx, name, args, kwargs):
        if name == "__setattr__":
            return self.setattr(tx, args[0].as_constant(), args[1])
        static = inspect.getattr_static(self.cls, name, None)
        if isinstance(static, types.FunctionType):
            return UserFunctionVariable(static).call(tx, [self, *args], kwargs)
        return super().call_method(tx, name, args, kwargs)

    def getitem(self, tx, key):
        return self.call_method(tx, "__getitem__", [key], {})

    def unpack(self, tx):
        iterator = self.call_method(tx, "__iter__", [], {})
        return iterator.unpack(tx)

    def truthy(self, tx) -> bool:
        for hook in ("__bool__", "__len__"):
            if isinstance(inspect.getattr_static(self.cls, hook, None), types.FunctionType):
                result = self.call_method(tx, hook, [], {})
                return result.truthy(tx)
        return True

    def reconstruct(self, cg):
        from kiln_capture.variables.containers import DictVariable

        attrs = DictVariable({k: (ConstantVariable(k), v) for k, v in self.attrs.items()})
        cg.call_object(rebuild_object, [ConstantVariable(self.cls), attrs])


_MISSING = object()


def rebuild_object(cls, attrs: dict):
    """Make an instance of ``cls`` with ``attrs``, without running ``__init__`` again."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def can_build_symbolically(cls: type) -> bool:
    """Plain Python classes: default ``__new__``, a Python ``__init__``, a ``__dict__``."""
    if cls.__new__ is not object.__new__ or "__slots__" in cls.__dict__:
        return False
    if issubclass(cls, (torch.nn.Module, torch.Tensor, BaseException, dict, list, tuple, set)):
        return False
    if type(cls) is not type:
        import abc

        if type(cls) is not abc.ABCMeta:
            return False
    init = cls.__init__
    return init is object.__init__ or isinstance(init, types.FunctionType)
