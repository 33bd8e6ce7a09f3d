"""What runs natively at a graph break: the breaking call itself, with its callee captured
on its own where it is the user's (a function, a method, a module: hooks run around its
captured forward, DDP around the module it wraps), and the stack values around it.
"""

from __future__ import annotations

import types

import torch

from kiln_capture import versions
from kiln_capture.variables.base import DeletedVariable, NullVariable, Variable
from kiln_capture.variables.builder import guarded_by_code


def emit_native_call(cg, root, inst, wrap_callee, handler_entry=None) -> list[Variable]:
    """Rebuild the stack below the call and perform the call natively (user functions are
    captured); the values below the call's operands."""
    from kiln_capture.opcodes.calls import pop_callable, split_kwargs
    from kiln_capture.variables.containers import DictVariable

    saved = list(root.stack)
    names = root.kw_names
    if inst.name == "CALL_FUNCTION_EX":
        kwargs_var = root.pop() if inst.arg & 1 else DictVariable({})
        args_var = root.pop()
        if versions.PY >= (3, 13):
            root.pop()
            fn_var = root.pop()
        else:
            fn_var = root.pop()
            if root.stack and is_null(root.peek()):
                root.pop()
        args = args_var.unpack(root)
        kwargs = {k: v for k, (_, v) in kwargs_var.entries.items()}
    else:
        if inst.name == "CALL_KW":
            names = root.pop().as_constant()
        raw = root.popn(inst.arg)
        fn_var, raw = pop_callable(root, raw)
        args, kwargs = split_kwargs(raw, names)
        args = list(args)
    below = list(root.stack)
    root.stack[:] = saved
    reconstruct_values(cg, below)
    cg.begin_handler_region(handler_entry)
    cg.call(
        lambda: emit_callee(cg, fn_var, wrap_callee),
        [lambda a=a: cg.reconstruct(a) for a in [*args, *kwargs.values()]],
        tuple(kwargs),
    )
    cg.end_handler_region(handler_entry)
    return below


def is_null(v) -> bool:
    """A NULL on the stack: below a callable, or the value of an unbound local that a 3.12
    comprehension saved (``LOAD_FAST_AND_CLEAR``) to restore after it."""
    return isinstance(v, (NullVariable, DeletedVariable))


def nulls(values) -> tuple[bool, ...]:
    return tuple(is_null(v) for v in values)


def reconstruct_values(cg, values) -> None:
    """Push the non-NULL values; the resume function pushes the NULLs itself."""
    for value in values:
        if not is_null(value):
            cg.reconstruct(value)


# Library code called at a graph break runs as it is, not captured on its own.
NATIVE_CALLEE_MODULES = ("contextlib",)


def emit_callee(cg, fn_var, wrap_callee) -> None:
    from kiln_capture.variables.functions import (
        BoundMethodVariable,
        NestedFunctionVariable,
        UserFunctionVariable,
    )
    from kiln_capture.variables.objects import ModuleVariable

    function = getattr(fn_var, "function", fn_var)
    if getattr(getattr(function, "fn", None), "__module__", None) in NATIVE_CALLEE_MODULES:
        cg.reconstruct(fn_var)
        return
    if isinstance(fn_var, UserFunctionVariable):
        if guarded_by_code(fn_var.fn, fn_var.source):  # this call's function, run natively
            cg.reconstruct(fn_var)
        else:
            cg.load_const(wrap_callee(fn_var.fn))
        return
    if isinstance(fn_var, ModuleVariable) and captured_on_its_own(fn_var.value):
        cg.load_const(wrap_callee(fn_var.value))
        return
    if isinstance(fn_var, NestedFunctionVariable) and fn_var.is_plain():
        # a function made in the frame (a comprehension's): the same for every call
        cg.load_const(wrap_callee(with_named_parameters(fn_var.function_object())))
        return
    if isinstance(fn_var, BoundMethodVariable) and isinstance(
        fn_var.function, UserFunctionVariable
    ):
        captured = wrap_callee(fn_var.function.fn)
        cg.call_object(types.MethodType, [ConstantValue(captured), fn_var.self_var])
        return
    cg.reconstruct(fn_var)


def captured_on_its_own(module: torch.nn.Module) -> bool:
    """A module called at a graph break is captured on its own (hooks run around its
    captured forward, DDP around the module it wraps), unless its call is compiled already
    (``_compiled_call_impl``) or its forward is not Python."""
    from kiln_capture.module_calls import runs_wrapped_module

    return module._compiled_call_impl is None and (
        runs_wrapped_module(module) or isinstance(type(module).forward, types.FunctionType)
    )


def with_named_parameters(fn: types.FunctionType) -> types.FunctionType:
    """``fn`` with a comprehension's ``.0`` parameter named as ``inspect`` names it
    (``implicit0``), so that guards and the dispatcher can take it as an argument."""
    code = fn.__code__
    names = tuple(f"implicit{n[1:]}" if n.startswith(".") else n for n in code.co_varnames)
    if names != code.co_varnames:
        fn.__code__ = code.replace(co_varnames=names)
    return fn


class ConstantValue(Variable):
    """A value loaded as a constant of the generated code."""

    def __init__(self, value):
        self.value = value

    def reconstruct(self, cg):
        cg.load_const(self.value)
