"""Callables: user functions (inlined), closures made inside the captured code, bound
methods, torch functions and tensor methods (recorded in the graph)."""

from __future__ import annotations

import inspect
import types
import weakref

import torch
from bytecode import Instr

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable


class CellVariable(Variable):
    """A closure cell: either made during capture or a real one of an existing function."""

    mutable = True

    def __init__(self, contents: Variable | None = None, real_cell=None, source=None):
        self.contents = contents
        self.real_cell = real_cell
        self.source = source

    def describe(self) -> str:
        return "a closure cell"

    def load(self, tx) -> Variable:
        if self.contents is not None:
            return self.contents
        if self.real_cell is None:
            raise GraphBreak("reading a free variable before it is bound")
        from kiln_capture.variables.builder import wrap

        try:
            value = self.real_cell.cell_contents
        except ValueError:
            raise GraphBreak("reading an empty closure cell") from None
        self.contents = wrap(tx, value, self.source)
        return self.contents

    def store(self, tx, value: Variable) -> None:
        self.contents = value
        if self.real_cell is not None:
            tx.side_effects.store_cell(self, value)

    def reconstruct(self, cg) -> None:
        cg.load_cell(self)


class BaseFunctionVariable(Variable):
    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        return tx.inline_call(self, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable(getattr(self.function_object(), name))
        if name == "__code__":
            return ConstantVariable(self.code())
        fn = self.function_object()
        if name in (
            "__wrapped__",
            "__defaults__",
            "__kwdefaults__",
            "__dict__",
            "__globals__",
        ) and hasattr(fn, name):
            from kiln_capture.sources import AttrSource
            from kiln_capture.variables.builder import wrap

            source = AttrSource(self.source, name) if self.source is not None else None
            return wrap(tx, getattr(fn, name), source)
        if name == "__get__":
            return super().getattr(tx, name)
        raise GraphBreak(f"attribute {name!r} of {self.describe()}")


class UserFunctionVariable(BaseFunctionVariable):
    """A Python function that exists outside the frame: its body is inlined when called."""

    def __init__(self, fn: types.FunctionType, source=None):
        self.fn = fn
        self.source = source

    def function_object(self):
        return self.fn

    def describe(self) -> str:
        return f"function {self.fn.__qualname__}"

    def identity_key(self):
        return ("object", id(self.fn))

    def code(self):
        return self.fn.__code__

    def globals(self):
        return self.fn.__globals__

    def bind(self, tx, args, kwargs) -> inspect.BoundArguments:
        return bind_arguments(tx, self.fn, args, kwargs, signature_of(self.fn))

    def closure_cells(self, tx) -> dict[str, CellVariable]:
        from kiln_capture.sources import AttrSource, ItemSource

        cells = {}
        for i, name in enumerate(self.fn.__code__.co_freevars):
            cell = self.fn.__closure__[i]
            source = None
            if self.source is not None:
                source = AttrSource(
                    ItemSource(AttrSource(self.source, "__closure__"), i), "cell_contents"
                )
            cells[name] = tx.output.cell_for(cell, source)
        return cells


class NestedFunctionVariable(BaseFunctionVariable):
    """A function made by MAKE_FUNCTION inside the captured code (a closure, a lambda)."""

    mutable = True  # rebuilt once where it is used twice: one function object, as eagerly

    def __init__(self, code, qualname, defaults, kwdefaults, closure, globals_):
        self.code_object = code
        self.qualname = qualname
        self.defaults = defaults  # TupleVariable or None
        self.kwdefaults = kwdefaults  # DictVariable or None
        self.closure = closure  # tuple of CellVariable or None
        self.globals_dict = globals_

    def function_object(self):
        return types.FunctionType(self.code_object, self.globals_dict, self.qualname)

    def is_plain(self) -> bool:
        """No closure, no defaults: every function made from this code is the same."""
        return not self.closure and self.defaults is None and self.kwdefaults is None

    def describe(self) -> str:
        return f"function {self.qualname} (defined in the captured code)"

    def code(self):
        return self.code_object

    def globals(self):
        return self.globals_dict

    def bind(self, tx, args, kwargs):
        code = self.code_object
        defaults = None
        if self.defaults is not None:
            defaults = tuple(
                self.defaults.items
                if hasattr(self.defaults, "items")
                else (ConstantVariable(v) for v in self.defaults.as_constant())
            )
        kwdefaults = (
            {k: v for k, (_, v) in self.kwdefaults.entries.items()} if self.kwdefaults else None
        )
        dummy_cells = tuple(types.CellType() for _ in code.co_freevars)
        fn = types.FunctionType(code, {}, code.co_name, defaults, dummy_cells or None)
        fn.__kwdefaults__ = kwdefaults
        return bind_arguments(tx, fn, args, kwargs)

    def closure_cells(self, tx):
        names = self.code_object.co_freevars
        return dict(zip(names, self.closure or (), strict=True))

    def reconstruct(self, cg) -> None:
        flags = 0
        if self.defaults is not None:
            cg.reconstruct(self.defaults)
            flags |= 0x01
        if self.kwdefaults is not None:
            cg.reconstruct(self.kwdefaults)
            flags |= 0x02
        if self.closure:  # over the real cells, shared with the frame and other closures
            for cell in self.closure:
                cg.reconstruct(cell)
            cg.emit(Instr("BUILD_TUPLE", len(self.closure)))
            flags |= 0x08
        cg.make_function(self.code_object, flags)


# function -> (what its signature is read from, the signature): a model's layers call the
# same functions, and reading a signature is a fifth of binding a call
_SIGNATURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def signature_of(fn) -> inspect.Signature:
    """``inspect.signature(fn, follow_wrapped=False)``, read again only where the function's
    code, defaults or ``__signature__`` changed."""
    if type(fn) is not types.FunctionType:
        return inspect.signature(fn, follow_wrapped=False)
    made_from = (fn.__code__, fn.__defaults__, fn.__kwdefaults__, vars(fn).get("__signature__"))
    found = _SIGNATURES.get(fn)
    if found is None or any(a is not b for a, b in zip(found[0], made_from, strict=True)):
        found = _SIGNATURES[fn] = (made_from, inspect.signature(fn, follow_wrapped=False))
    return found[1]


def bind_arguments(tx, fn, args, kwargs, signature=None) -> inspect.BoundArguments:
    """Bind variables to ``fn``'s parameters; defaults that are real objects get wrapped."""
    from kiln_capture.exc import UserError
    from kiln_capture.variables.builder import wrap_derived

    if signature is None:
        signature = inspect.signature(fn, follow_wrapped=False)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise UserError(TypeError(f"{fn.__name__}() {exc}")) from None
    bound.apply_defaults()
    for name, value in bound.arguments.items():
        if not isinstance(value, Variable) and not isinstance(value, (tuple, dict)):
            bound.arguments[name] = wrap_derived(tx, value)
    return bound


class BoundMethodVariable(Variable):
    """``obj.method`` for a Python method: calling it inlines ``method(obj, ...)``."""

    def __init__(self, function: Variable, self_var: Variable, source=None):
        self.function = function
        self.self_var = self_var
        self.source = source

    def python_type(self):
        return types.MethodType

    def describe(self) -> str:
        return f"method {self.function.describe()} of {self.self_var.describe()}"

    def call(self, tx, args, kwargs):
        return self.function.call(tx, [self.self_var, *args], kwargs)

    def getattr(self, tx, name):
        if name == "__self__":
            return self.self_var
        if name == "__func__":
            return self.function
        return self.function.getattr(tx, name)

    def reconstruct(self, cg) -> None:
        if self.source is not None:
            return self.source.emit(cg)
        cg.call_object(types.MethodType, [self.function, self.self_var])


class CallableObjectVariable(Variable):
    """A callable held by reference (a C function, a torch function), rebuilt as itself."""

    kind = "callable"

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def describe(self) -> str:
        return f"{self.kind} {getattr(self.fn, '__name__', self.fn)}"

    def identity_key(self):
        return ("object", id(self.fn))

    def reconstruct(self, cg):
        if self.source is not None:
            return self.source.emit(cg)
        cg.load_const(self.fn)


class TorchFunctionVariable(CallableObjectVariable):
    """A function from torch, torch.nn.functional, torch.Tensor, operator or math that
    runs on tensors: calling it records a node in the graph."""

    kind = "torch function"

    def call(self, tx, args, kwargs):
        from kiln_capture.variables.torch_calls import call_torch_function

        return call_torch_function(tx, self.fn, args, kwargs)


class TensorMethodVariable(Variable):
    """``tensor.method`` before it is called."""

    def __init__(self, tensor, name: str):
        self.tensor = tensor
        self.name = name

    def describe(self) -> str:
        return f"Tensor.{self.name}"

    def call(self, tx, args, kwargs):
        return self.tensor.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, cg):
        cg.reconstruct(self.tensor)
        cg.load_attr(self.name)


def is_torch_callable(value) -> bool:
    """Functions whose calls with tensors become graph nodes."""
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(value, "__module__", None) or ""
    if isinstance(value, types.BuiltinFunctionType | types.BuiltinMethodType) or callable(value):
        if module.startswith(
            (
                "torch.nn.functional",
                "torch.functional",
                "torch._C._nn",
                "torch._C._linalg",
                "torch._C._fft",
                "torch._C._special",
                "torch.fft",
                "torch.linalg",
                "torch.special",
            )
        ):
            return True
        if module == "torch" or module.startswith("torch._tensor") or module == "torch._C":
            return not isinstance(value, type)
        if getattr(value, "__self__", None) is torch._C._VariableFunctions:
            return True
        if getattr(value, "__objclass__", None) is torch._C.TensorBase:
            return True
    return False


# Standard-library modules whose functions only read their arguments: called for real at
# capture time when every argument is a value known then.
PURE_MODULES = (
    "inspect",
    "typing",
    "re",
    "string",
    "dataclasses",
    "enum",
    "keyword",
    "posixpath",
    "genericpath",
    "fnmatch",
    "textwrap",
)


def real_value(v: Variable, metadata_only: bool = False):
    """The real Python object a variable stands for, as a 1-tuple, or ``None``.

    Only objects the guards pin down (constants, functions, classes, modules, objects
    computed during capture) qualify: a result computed from them is the same on every
    call that passes the guards. With ``metadata_only`` (a function that reads only
    signatures and types), objects from the frame's inputs qualify too.
    """
    from kiln_capture.variables.containers import SequenceVariable
    from kiln_capture.variables.objects import ModuleVariable, ObjectVariable

    if v.is_constant():
        return (v.as_constant(),)
    if isinstance(v, UserFunctionVariable):
        return (v.fn,)
    if isinstance(v, BoundMethodVariable):
        func, obj = real_value(v.function), real_value(v.self_var, metadata_only)
        if func is not None and obj is not None:
            return (types.MethodType(func[0], obj[0]),)
        return None
    if (
        isinstance(v, (ObjectVariable, ModuleVariable))
        and v.source is not None
        and not (metadata_only or isinstance(v.value, (type, types.ModuleType)))
    ):
        return None
    for attr in ("value", "fn"):
        obj = getattr(v, attr, None)
        if obj is not None and not isinstance(obj, Variable):
            return (obj,)
    if isinstance(v, SequenceVariable) and not v.mutable:
        parts = [real_value(item) for item in v.items]
        if all(part is not None for part in parts):
            return (tuple(part[0] for part in parts),)
    return None


def is_metadata_function(fn) -> bool:
    """Functions that read signatures and types only, never the values they are given."""
    import dataclasses

    module = (fn.__module__ or "").split(".")[0]
    return module in ("inspect", "typing") or fn in (dataclasses.fields, dataclasses.is_dataclass)


class PureFunctionVariable(UserFunctionVariable):
    """A function of a pure standard-library module: run for real on known values."""

    def call(self, tx, args, kwargs):
        from kiln_capture.variables.builder import wrap_derived

        metadata = is_metadata_function(self.fn)
        reals = [real_value(a, metadata) for a in args]
        kw_reals = {k: real_value(v, metadata) for k, v in kwargs.items()}
        if all(r is not None for r in reals) and all(r is not None for r in kw_reals.values()):
            result = tx.run_user_code(
                self.fn, *(r[0] for r in reals), **{k: r[0] for k, r in kw_reals.items()}
            )
            return wrap_derived(tx, result)
        return super().call(tx, args, kwargs)
