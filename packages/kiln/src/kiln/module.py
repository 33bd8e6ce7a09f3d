"""What ``kiln.compile`` returns: a compiled function, or a module that behaves like the
model.

:class:`CompiledModule` is an ``nn.Module`` whose ``forward`` is captured and whose state is
the model's own: attributes are read from and written to the model, ``parameters()``,
``buffers()``, ``modules()`` and ``state_dict()`` are the model's (same objects, same keys,
no prefix), ``load_state_dict`` loads into the model, and ``train()``, ``eval()``, ``to()``
and friends change the model and return the wrapper.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import threading
import types

import torch
from torch.nn.modules.module import (
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

from kiln.frames import call_timing_capture

_state = threading.local()
# disabled regions open in any thread: while there is none, a call reads only this (a
# thread-local read costs more than the rest of a compiled module's call path)
_open_regions = [0]
_regions_lock = threading.Lock()


def compilation_disabled() -> bool:
    return _open_regions[0] > 0 and getattr(_state, "disabled", 0) > 0


class DisabledRegion:
    """``with kiln.disable():`` or ``@kiln.disable``: Kiln-compiled callables run eagerly."""

    def __enter__(self):
        with _regions_lock:
            _open_regions[0] += 1
        _state.disabled = getattr(_state, "disabled", 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        _state.disabled -= 1
        with _regions_lock:
            _open_regions[0] -= 1

    def __call__(self, fn):
        @functools.wraps(fn)
        def run_eagerly(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        run_eagerly.__kiln_disabled__ = True
        return run_eagerly


class CompiledFunction:
    """A function compiled by ``kiln.compile``; call it as the function itself."""

    def __init__(self, fn, session, captured) -> None:
        self._orig_fn = fn
        self._session = session
        self._captured = captured
        functools.update_wrapper(self, fn)
        # inspect.signature would unwrap to fn at every call: Hugging Face's generate()
        # asks for the forward's signature at every step
        with contextlib.suppress(TypeError, ValueError):  # none: the wrapper has none either
            self.__signature__ = inspect.signature(fn)

    def __call__(self, *args, **kwargs):
        if compilation_disabled():
            return self._orig_fn(*args, **kwargs)
        return call_timing_capture(self._captured, args, kwargs, self.__qualname__)

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<kiln compiled {getattr(self._orig_fn, '__qualname__', self._orig_fn)!r}>"


# nn.Module methods that read or change the module's state: run on the model. Those in
# RETURN_SELF return the model itself; the wrapper returns itself instead.
DELEGATED = (
    "parameters",
    "named_parameters",
    "buffers",
    "named_buffers",
    "children",
    "named_children",
    "modules",
    "named_modules",
    "state_dict",
    "load_state_dict",
    "register_buffer",
    "register_parameter",
    "register_module",
    "add_module",
    "get_submodule",
    "get_parameter",
    "get_buffer",
    "_save_to_state_dict",
    "_load_from_state_dict",
    "zero_grad",
    "extra_repr",
)
RETURN_SELF = (
    "_apply",
    "train",
    "eval",
    "requires_grad_",
    "to",
    "to_empty",
    "cpu",
    "cuda",
    "type",
    "float",
    "double",
    "half",
    "bfloat16",
    "apply",
    "share_memory",
)
_OWN = frozenset({"_orig_mod", "_captured", "_session"})


def _delegate(name: str):
    def method(self, *args, **kwargs):
        return getattr(self._orig_mod, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(torch.nn.Module, name).__doc__
    return method


def _delegate_returning_self(name: str):
    def method(self, *args, **kwargs):
        getattr(self._orig_mod, name)(*args, **kwargs)
        return self

    method.__name__ = name
    method.__doc__ = getattr(torch.nn.Module, name).__doc__
    return method


class CompiledModule(torch.nn.Module):
    """A module compiled by ``kiln.compile``: it calls the captured ``forward``, and is the
    model for everything else (attributes, parameters, modes, state dicts)."""

    def __init__(self, module: torch.nn.Module, session, captured) -> None:
        # the model is kept outside nn.Module's registries, so nothing is listed twice and
        # state_dict keys carry no prefix
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_captured", captured)
        mode = module.training
        super().__init__()  # sets ``training``, which is the model's: keep the model's mode
        module.training = mode
        # nn.Module's own recursion (a parent's state_dict, load_state_dict, to(), apply())
        # walks these dicts: they are the model's, so a compiled submodule is the model
        for registry in ("_parameters", "_buffers", "_modules"):
            object.__setattr__(self, registry, getattr(module, registry))

    def __call__(self, *args, **kwargs):
        # nn.Module's call without its work where there is none to do (no hooks on the
        # wrapper, no global hooks, no TorchScript trace, Kiln not disabled): the captured
        # module's forward, which runs the model eagerly if the model has hooks
        if (
            self._forward_hooks
            or self._forward_pre_hooks
            or self._backward_hooks
            or self._backward_pre_hooks
            or _global_forward_hooks
            or _global_forward_pre_hooks
            or _global_backward_hooks
            or _global_backward_pre_hooks
            or self._compiled_call_impl is not None
            or compilation_disabled()
            or torch._C._get_tracing_state()
        ):
            return super().__call__(*args, **kwargs)
        return call_timing_capture(self._captured.forward, args, kwargs, self._orig_mod)

    def forward(self, *args, **kwargs):
        if compilation_disabled():
            return self._orig_mod(*args, **kwargs)
        return call_timing_capture(self._captured, args, kwargs, self._orig_mod)

    @property
    def training(self) -> bool:
        return self._orig_mod.training

    @training.setter
    def training(self, mode: bool) -> None:
        self._orig_mod.training = mode

    def __getattr__(self, name: str):
        if name in _OWN:  # not set yet (copying, unpickling)
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value) -> None:
        # the wrapper's own attributes are nn.Module's bookkeeping (hooks, flags), set in
        # __init__; everything else is the model's
        if name in self.__dict__ or name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self.__dict__:
            object.__delattr__(self, name)
        else:
            delattr(self._orig_mod, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    # a copy (or an unpickled one) is the model's copy, compiled again with the same config
    def __deepcopy__(self, memo):
        return _compile_again(copy.deepcopy(self._orig_mod, memo), self._session.config)

    def __reduce_ex__(self, protocol):
        return _compile_again, (self._orig_mod, self._session.config)

    def __repr__(self) -> str:
        return f"CompiledModule({self._orig_mod!r})"

    # container modules (Sequential, ModuleList) keep their protocol
    def __getitem__(self, index):
        return self._orig_mod[index]

    def __len__(self) -> int:
        return len(self._orig_mod)

    def __iter__(self):
        return iter(self._orig_mod)


def _compile_again(model: torch.nn.Module, config) -> CompiledModule:
    from kiln.api import _compile

    return _compile(model, config, disable=False)


for _name in DELEGATED:
    setattr(CompiledModule, _name, _delegate(_name))
for _name in RETURN_SELF:
    setattr(CompiledModule, _name, _delegate_returning_self(_name))
del _name
