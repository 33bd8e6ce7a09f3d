"""Regional compilation: when capture gives up on a frame (it runs eagerly from then on),
what the frame calls is compiled on its own, so the program still runs compiled code below
the frame capture could not take.

- A module's ``forward`` (or another method of a module compiled as a bound method): each
  of the module's direct submodules is compiled through nn.Module's own hook for it,
  ``_compiled_call_impl`` (what ``nn.Module.compile()`` sets): its ``_call_impl``, hooks
  included, is captured with the same backend, mode and options as the module.
- Any other function (the one compiled, a function called at a graph break, the rest of a
  frame after one): it runs as a copy whose reads of global names go through
  :class:`Redirect` (``kiln_capture.callees``): a Python function of the user's it reads is
  compiled on its own (once) and called compiled, an ``nn.Module`` it reads gets
  ``_compiled_call_impl`` as a submodule does. Everything else it reads is what it was.

One warning names the frame, why it runs eagerly and what is compiled instead.
"""

from __future__ import annotations

import re
import sys
import types
import warnings

import torch

from kiln_capture import user_frames
from kiln_capture.callees import global_names, with_redirected_globals
from kiln_capture.user_frames import user_stacklevel


def compile_submodules(
    module: torch.nn.Module, config, reason: str, method: str = "forward"
) -> list[str]:
    """Compile ``module``'s direct submodules on their own (its ``method`` runs eagerly);
    their names."""
    from kiln.api import _compile

    compiled = []
    for name, child in module.named_children():
        if getattr(child, "_compiled_call_impl", None) is not None:
            continue  # compiled already (by the user, or by an earlier fallback)
        child._compiled_call_impl = _compile(child._call_impl, config, disable=False)
        compiled.append(name)
    if compiled:
        warnings.warn(
            f"kiln: {type(module).__qualname__}.{method} runs eagerly ({reason}); its "
            f"submodules {', '.join(compiled)} are compiled on their own instead. To compile "
            f"the whole model, move what capture cannot take out of {method} "
            "(KILN_LOGS=graph_breaks says where)",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
    return compiled


# Modules whose functions are not compiled on their own: the stack itself, torch, NumPy
# and the standard library (a function there is not the user's program).
NOT_THE_USERS = (*user_frames.NOT_THE_USERS, "numpy")


def compile_callees(captured, config, reason: str) -> list[str]:
    """Let ``captured`` (which now runs eagerly) call the user functions and modules it
    reads from its globals compiled; the names of those it reads now."""
    fn = captured.fn
    names = [n for n in global_names(fn) if is_compilable(fn.__globals__.get(n))]
    if not names:
        return []
    captured.eager_fn = with_redirected_globals(fn, Redirect(config))
    warnings.warn(
        f"kiln: {describe_frame(fn)} runs eagerly ({reason}); the functions and modules it "
        f"calls ({', '.join(names)}) are compiled on their own instead. To compile it "
        "whole, move what capture cannot take out of it (KILN_LOGS=graph_breaks says where)",
        RuntimeWarning,
        stacklevel=user_stacklevel(),
    )
    return names


class Redirect:
    """``redirect(value)`` for the globals an eager frame reads: a user function becomes
    its compiled version (made once), a module gets compiled through its hook."""

    def __init__(self, config) -> None:
        self.config = config
        self.compiled: dict[int, tuple[object, object]] = {}  # id -> (function, compiled)

    def __call__(self, value):
        if type(value) is types.FunctionType:
            if not is_users_function(value):
                return value
            found = self.compiled.get(id(value))
            if found is None or found[0] is not value:
                from kiln.api import _compile

                found = (value, _compile(value, self.config, disable=False))
                self.compiled[id(value)] = found
            return found[1]
        if isinstance(value, torch.nn.Module) and is_compilable(value):
            from kiln.api import _compile

            value._compiled_call_impl = _compile(value._call_impl, self.config, disable=False)
        return value


def is_compilable(value) -> bool:
    """A user function, or a module not compiled yet (by the user or by Kiln)."""
    from kiln.module import CompiledModule

    if type(value) is types.FunctionType:
        return is_users_function(value)
    return (
        isinstance(value, torch.nn.Module)
        and not isinstance(value, CompiledModule)
        and getattr(value, "_compiled_call_impl", None) is None
    )


def is_users_function(fn: types.FunctionType) -> bool:
    if getattr(fn, "__kiln_disabled__", False):  # kiln.disable: it runs eagerly on purpose
        return False
    root = (fn.__module__ or "").split(".")[0]
    return root not in NOT_THE_USERS and root not in sys.stdlib_module_names


def describe_frame(fn: types.FunctionType) -> str:
    """``fn``'s name, or for a resume function the function and line it continues."""
    from kiln_capture.resume import RESUME_ORIGINS, original_position

    if fn.__code__ not in RESUME_ORIGINS:
        return fn.__qualname__
    original, _ = original_position(fn.__code__, 0)
    resumed_at = re.search(r"_resume_at_(\d+)$", fn.__code__.co_name)
    return f"the rest of {original.co_qualname} (after a graph break{where(original, resumed_at)})"


def where(code: types.CodeType, resumed_at) -> str:
    from kiln_capture.program import load_program

    if resumed_at is None:
        return ""
    instrs = load_program(code).instrs
    index = int(resumed_at.group(1))
    line = instrs[index].lineno if index < len(instrs) else None
    return f", from line {line}" if line else ""
