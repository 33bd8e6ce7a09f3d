"""Calls of torch functions during capture, and torch's global-state context managers.

A torch function called with tensors becomes a ``call_function`` node. Functions that read
global state (grad mode, default dtype, ...) are answered from that state, which the
guards check. ``no_grad``/``enable_grad``/``set_grad_enabled``/``autocast`` become
variables whose enter and exit are recorded in the graph.
"""

from __future__ import annotations

import functools
import types

import torch

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.torchscript import TORCHSCRIPT_CALLS


def _answer(value):
    return lambda tx, *args, **kwargs: ConstantVariable(value() if callable(value) else value)


STATE_READERS = {
    torch.is_grad_enabled: _answer(torch.is_grad_enabled),
    torch.get_default_dtype: _answer(torch.get_default_dtype),
    torch.is_autocast_enabled: None,  # filled below: depends on the device argument
    torch.compiler.is_compiling: _answer(True),
    torch.is_inference_mode_enabled: _answer(torch.is_inference_mode_enabled),
}
if hasattr(torch.compiler, "is_dynamo_compiling"):
    STATE_READERS[torch.compiler.is_dynamo_compiling] = _answer(False)
GRAPH_BREAKING = {
    torch.manual_seed,
    torch.seed,
    torch.set_default_dtype,
    torch.autograd.grad,
    torch.autograd.backward,
}


def _is_autocast_enabled(tx, *args):
    device = args[0].as_constant() if args else "cuda"
    return ConstantVariable(torch.is_autocast_enabled(device))


STATE_READERS[torch.is_autocast_enabled] = _is_autocast_enabled
STATE_READERS.update(TORCHSCRIPT_CALLS)  # answered at capture time, as they run eagerly
METADATA_FUNCTIONS = {torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel}


def call_torch_function(tx, fn, args, kwargs) -> Variable:
    reader = STATE_READERS.get(fn)
    if reader is not None:
        return reader(tx, *args, **kwargs)
    context = CONTEXT_MANAGERS.get(fn)
    if context is not None:
        return context(tx, *args, **kwargs)
    if fn in GRAPH_BREAKING:
        raise GraphBreak(
            f"{fn.__module__}.{fn.__qualname__}() runs outside the graph "
            f"(it changes global state or runs autograd)"
        )
    if args and type(args[0]).__name__ == "NumpyArrayVariable":
        from kiln_capture.variables import ndarray

        if fn in ndarray.TENSOR_FROM_NDARRAY:
            return ndarray.tensor_from_ndarray(tx, fn, args, kwargs)
    if fn is torch.is_tensor:
        from kiln_capture.variables.tensor import TensorVariable

        return ConstantVariable(isinstance(args[0], TensorVariable))
    if fn in (torch.is_floating_point, torch.is_complex, torch.numel):
        return args[0].call_method(tx, fn.__name__, [], {})
    constant_args = all(a.is_constant() for a in [*args, *kwargs.values()])
    if constant_args and (fn in (torch.finfo, torch.iinfo) or isinstance(fn, type)):
        return ConstantVariable(fn(*(a.as_constant() for a in args)))
    return tx.output.call_graph("call_function", graph_target(fn), list(args), kwargs)


def graph_target(fn):
    """``fn`` as the graph records it. A builtin of ``torch._C._VariableFunctions`` prints
    in graph code as ``torch.<name>``; where that name is a Python wrapper with another
    signature (``torch.broadcast_tensors`` takes ``*tensors``, the builtin a list), the
    graph calls the builtin through a function of its own instead."""
    name = getattr(fn, "__name__", None)
    if not isinstance(fn, types.BuiltinFunctionType) or not isinstance(name, str):
        return fn
    if (
        getattr(torch._C._VariableFunctions, name, None) is fn
        and getattr(torch, name, None) is not fn
    ):
        return _variable_function(name)
    return fn


@functools.cache
def _variable_function(name: str):
    builtin = getattr(torch._C._VariableFunctions, name)

    def call(*args, **kwargs):
        return builtin(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"variable_function_{name}"
    return call


class GradModeVariable(Variable):
    """``torch.no_grad()``, ``torch.enable_grad()`` or ``torch.set_grad_enabled(mode)``."""

    def __init__(self, mode: bool):
        self.mode = mode
        self.previous: bool | None = None

    def describe(self) -> str:
        return f"grad mode {self.mode}"

    def enter(self, tx) -> Variable:
        self.previous = torch.is_grad_enabled()
        set_grad_mode(tx, self.mode)
        return ConstantVariable(None)

    def exit(self, tx) -> Variable:
        set_grad_mode(tx, self.previous)
        return ConstantVariable(None)

    def reconstruct_exit(self, cg) -> None:
        cg.call_object(grad_mode_exit, [ConstantVariable(self.previous)])

    def call(self, tx, args, kwargs):
        # used as a decorator: @torch.no_grad()
        from kiln_capture.variables.functions import BaseFunctionVariable

        if len(args) == 1 and isinstance(args[0], BaseFunctionVariable):
            return ContextWrappedFunction(self, args[0])
        return super().call(tx, args, kwargs)

    def reconstruct(self, cg):
        cg.call_object(_grad_mode_class(self.mode), [])


def _restore_grad_mode(previous: bool):
    def exit_grad_mode(*exc_info):
        torch._C._set_grad_enabled(previous)
        return False

    exit_grad_mode.__qualname__ = f"exit_grad_mode_to_{previous}"
    return exit_grad_mode


# One exit per mode, so that the identity guards on a rebuilt exit hold from call to call.
GRAD_MODE_EXITS = {mode: _restore_grad_mode(mode) for mode in (False, True)}


def grad_mode_exit(previous: bool):
    """The ``__exit__`` of a grad-mode block entered during capture: restores ``previous``."""
    return GRAD_MODE_EXITS[previous]


def _grad_mode_class(mode):
    return torch.enable_grad if mode else torch.no_grad


def set_grad_mode(tx, mode: bool) -> None:
    """Switch grad mode for the rest of the trace and record the switch in the graph."""
    torch._C._set_grad_enabled(mode)
    tx.output.graph.call_function(torch._C._set_grad_enabled, (mode,))
    tx.output.grad_mode_changes.append(mode)


class AutocastVariable(Variable):
    def __init__(self, device_type: str, dtype, enabled: bool, cache_enabled):
        self.args = (device_type, dtype, enabled, cache_enabled)
        self.node = None

    def describe(self) -> str:
        return f"autocast({self.args[0]})"

    def enter(self, tx) -> Variable:
        from torch.amp import autocast_mode

        device_type, dtype, enabled, cache = self.args
        real = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache)
        real.__enter__()
        tx.output.live_contexts.append(real)
        self.real = real
        self.node = tx.output.graph.call_function(autocast_mode._enter_autocast, self.args)
        return ConstantVariable(None)

    def exit(self, tx) -> Variable:
        self.real.__exit__(None, None, None)
        tx.output.live_contexts.remove(self.real)
        self.leave_in_graph(tx)
        return ConstantVariable(None)

    def leave_in_graph(self, tx) -> None:
        """The graph leaves the region here: where the block ends, or last in a graph that
        ends at a break inside it (the code after that graph enters a real region again,
        :meth:`reconstruct_exit`)."""
        from torch.amp import autocast_mode

        tx.output.graph.call_function(autocast_mode._exit_autocast, (self.node,))

    def reconstruct_exit(self, cg) -> None:
        device_type, dtype, enabled, cache = self.args
        name = None if dtype is None else str(dtype).removeprefix("torch.")
        args = [ConstantVariable(a) for a in (device_type, name, enabled, cache)]
        cg.call_object(autocast_entered_at_a_break, args)


def autocast_entered_at_a_break(device_type, dtype_name, enabled, cache_enabled):
    """The bound ``__exit__`` of a real autocast region entered now: after a graph that broke
    inside the region, the native instruction and the resume function run inside it, and
    the block's end (or its exception handler) leaves it as the original ``with`` would."""
    dtype = None if dtype_name is None else getattr(torch, dtype_name)
    region = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    region.__enter__()
    return region.__exit__


class ContextWrappedFunction(Variable):
    """A function decorated by a grad-mode context: calling it runs it inside the context."""

    def __init__(self, context, function):
        self.context = context
        self.function = function

    def call(self, tx, args, kwargs):
        self.context.enter(tx)
        try:
            return self.function.call(tx, args, kwargs)
        finally:
            self.context.exit(tx)


def _no_grad(tx, *args, **kwargs):
    return GradModeVariable(False)


def _enable_grad(tx, *args, **kwargs):
    return GradModeVariable(True)


class SetGradEnabledVariable(GradModeVariable):
    """``torch.set_grad_enabled(mode)``: takes effect when called, and restores the previous
    mode when used as a context manager."""

    def __init__(self, tx, mode: bool):
        super().__init__(mode)
        self.previous = torch.is_grad_enabled()
        set_grad_mode(tx, mode)

    def enter(self, tx) -> Variable:
        return ConstantVariable(None)

    def reconstruct(self, cg):
        cg.call_object(torch.set_grad_enabled, [ConstantVariable(self.mode)])


def _set_grad_enabled(tx, mode, *args, **kwargs):
    return SetGradEnabledVariable(tx, mode.as_constant())


def _autocast(tx, device_type=None, dtype=None, enabled=None, cache_enabled=None, **kwargs):
    def const(v, default=None):
        return v.as_constant() if v is not None else default

    device = const(device_type, "cuda")
    return AutocastVariable(device, const(dtype), const(enabled, True), const(cache_enabled))


CONTEXT_MANAGERS = {
    torch.no_grad: _no_grad,
    torch.enable_grad: _enable_grad,
    torch.set_grad_enabled: _set_grad_enabled,
    torch.autocast: _autocast,
    torch.amp.autocast: _autocast,
}
