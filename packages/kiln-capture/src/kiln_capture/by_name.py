"""Values as bytes that another process reads back as the same objects: what a kept capture
holds (guard constants, sources, code constants).

Objects with an identity are written by name and read back by looking the name up, never
copied:

- a class or a function by its module and qualified name (pickle's own check that the name
  finds the object); a function its name does not find, by where it lies in its module
  (another global, what a global wraps, an item of a registry);
- the interpreter's own types by their names in ``types``;
- a module by its name in ``sys.modules``; a module's globals dict or the builtins dict by
  the module's name.

Plain data (numbers, strings, containers of them, dtypes, devices, sizes, enum members) and
capture's own records (sources, guard lines, tensor specs) are written by value. Anything
else raises :class:`Unkeepable`, and the capture is not kept (an instance compared by
identity, a code object made at run time).

A code object (the epilogue of a captured frame) is written with ``marshal``; the constants
marshal cannot write (a class to rebuild an output with, a module's globals dict), and the
mutable containers it would copy, are written by name beside it: a list or dict the code
shares with the program has none, and the code is not kept.
"""

from __future__ import annotations

import builtins
import enum
import io
import marshal
import pickle
import sys
import types

import torch

from kiln_capture import guards, sources, tensor_match

# written by their fields: capture's records and torch's plain values
BY_VALUE = (
    sources.Source,
    guards.Guard,
    tensor_match.TensorSpec,
    torch.dtype,
    torch.device,
    torch.Size,
    slice,
    enum.Enum,
)
# written by name (pickle looks the name up and checks it finds the same object)
BY_NAME = (
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
)
PLAIN = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)


# the interpreter's types that ``builtins`` does not name (``builtin_function_or_method``)
TYPES_MODULE_NAMES = {v: k for k, v in vars(types).items() if isinstance(v, type)}


class Unkeepable(Exception):
    """A value that cannot be written so that another process finds the same object."""


# mutable containers: a code constant of this type is an object the code shares with the
# program (a list it appends to): never written by value, where a copy would not be it
MUTABLE = (list, dict, set, bytearray)


class _Writer(pickle.Pickler):
    def __init__(self, file, shared_only: bool = False):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared_only = shared_only  # mutable containers only by name (code constants)

    def persistent_id(self, obj):
        if isinstance(obj, type) and obj in TYPES_MODULE_NAMES:
            return ("types", TYPES_MODULE_NAMES[obj])
        if isinstance(obj, types.FunctionType) and not _by_name(obj):
            return ("path", _path_in_module(obj))
        if isinstance(obj, types.ModuleType):
            if sys.modules.get(obj.__name__) is not obj:
                raise Unkeepable(f"module {obj.__name__!r} is not sys.modules[{obj.__name__!r}]")
            return ("module", obj.__name__)
        if type(obj) is dict:
            if obj is builtins.__dict__:
                return ("globals", "builtins")
            name = obj.get("__name__")
            module = sys.modules.get(name) if isinstance(name, str) else None
            if module is not None and getattr(module, "__dict__", None) is obj:
                return ("globals", name)
        if self.shared_only and isinstance(obj, MUTABLE):
            raise Unkeepable(f"a {type(obj).__name__} the code shares has no name to keep it by")
        return None

    def reducer_override(self, obj):
        if isinstance(obj, PLAIN + BY_NAME + BY_VALUE) and not isinstance(obj, types.CodeType):
            return NotImplemented
        raise Unkeepable(f"a {type(obj).__qualname__} ({_short(obj)}) has no name to keep it by")


def _by_name(obj: object) -> bool:
    """Whether pickle finds ``obj`` by its module and qualified name."""
    found = sys.modules.get(getattr(obj, "__module__", None) or "")
    for part in getattr(obj, "__qualname__", "<locals>").split("."):
        found = getattr(found, part, None)
    return found is obj


def _path_in_module(obj: object) -> tuple:
    """Where a function that its name does not find lies in its module: a global of
    another name (``boolean_dispatch``'s ``F.max_pool2d``), the function a global wraps
    (``__wrapped__``), or an item of a global dict or an attribute of a global class (a
    registry of implementations). Steps are ``("attr", name)`` or ``("item", key)``."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if module is None:
        raise Unkeepable(f"{obj!r} has no module to find it in")
    for name, value in list(vars(module).items()):
        for steps, found in _within(value):
            if found is obj:
                return (module.__name__, (("attr", name), *steps))
    raise Unkeepable(f"{obj!r} is not found in its module {module.__name__}")


def _within(value: object):
    """``value`` and what lies one step below it: ``(steps, object)`` pairs."""
    yield (), value
    wrapped = getattr(value, "__wrapped__", None) if callable(value) else None
    if wrapped is not None:
        yield (("attr", "__wrapped__"),), wrapped
    if type(value) is dict:
        for key, item in list(value.items()):
            if type(key) is str:
                yield (("item", key),), item
    elif isinstance(value, type):
        for key, item in list(vars(value).items()):
            yield (("attr", key),), item
            if type(item) is dict:
                for inner, found in list(item.items()):
                    if type(inner) is str:
                        yield (("attr", key), ("item", inner)), found


class _Reader(pickle.Unpickler):
    def persistent_load(self, pid):
        kind, name = pid
        if kind == "types":
            return getattr(types, name)
        if kind == "path":
            module, steps = name
            found = sys.modules.get(module) or __import__(module, fromlist=["_"])
            for step, key in steps:
                found = getattr(found, key) if step == "attr" else found[key]
            return found
        if kind == "module":
            return sys.modules.get(name) or __import__(name, fromlist=["_"])
        if name == "builtins":
            return builtins.__dict__
        module = sys.modules.get(name) or __import__(name, fromlist=["_"])
        return module.__dict__


def dumps(value: object, shared_only: bool = False) -> bytes:
    """``value`` as bytes (:class:`Unkeepable` where something in it has no name; with
    ``shared_only``, also where it holds a list, dict, set or bytearray other than a
    module's globals)."""
    buffer = io.BytesIO()
    try:
        _Writer(buffer, shared_only).dump(value)
    except Unkeepable:
        raise
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise Unkeepable(str(exc)) from None
    return buffer.getvalue()


def loads(data: bytes) -> object:
    """What :func:`dumps` wrote, the named objects looked up in this process."""
    return _Reader(io.BytesIO(data)).load()


_MARK = "___kiln_by_name"


def dump_code(code: types.CodeType) -> bytes:
    """``code`` as bytes: ``marshal``, with the constants it cannot write by name."""
    kept: list[object] = []
    plain = _marked(code, kept)
    return dumps(marshal.dumps(plain)) + dumps(tuple(kept), shared_only=True)


def load_code(data: bytes) -> types.CodeType:
    reader = io.BytesIO(data)
    written, kept = _Reader(reader).load(), _Reader(reader).load()
    return _unmarked(marshal.loads(written), kept)


def _marked(code: types.CodeType, kept: list) -> types.CodeType:
    consts = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            consts.append(_marked(const, kept))
            continue
        try:
            marshal.dumps(const)
            shared = _holds_mutable(const)  # marshal would copy it
        except ValueError:
            shared = True
        if shared:
            consts.append((_MARK, len(kept)))
            kept.append(const)
            continue
        consts.append(const)
    return code.replace(co_consts=tuple(consts))


def _holds_mutable(value: object) -> bool:
    if isinstance(value, MUTABLE):
        return True
    if isinstance(value, (tuple, frozenset)):
        return any(_holds_mutable(item) for item in value)
    return False


def _unmarked(code: types.CodeType, kept: list) -> types.CodeType:
    consts = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            const = _unmarked(const, kept)
        elif type(const) is tuple and len(const) == 2 and const[0] == _MARK:
            const = kept[const[1]]
        consts.append(const)
    return code.replace(co_consts=tuple(consts))


def _short(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a repr that raises names nothing
        text = "?"
    return text if len(text) <= 60 else text[:57] + "..."
