"""Torch functions rewritten above autograd while a graph is traced.

The decomposition table applies below autograd: an op keeps its own derivative formula, and
one that has none cannot be traced for gradients. A function of
:data:`PRE_AUTOGRAD_DECOMPOSITIONS` is replaced, while :class:`PreAutogradDecompositions` is
active, by torch functions that have formulas and give eager's values and gradients:
``aminmax`` is ``amin`` and ``amax`` (torch 2.11 has no derivative for ``aminmax``; 2.13's
is theirs, so graphs are the same on both).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

# torch function (as __torch_function__ receives it) -> its replacement, same signature
PRE_AUTOGRAD_DECOMPOSITIONS: dict[Callable, Callable] = {}


def register_pre_autograd(*funcs: Callable) -> Callable[[Callable], Callable]:
    """Register a replacement for the torch functions ``funcs`` (see the module docstring)."""

    def register(fn: Callable) -> Callable:
        for func in funcs:
            PRE_AUTOGRAD_DECOMPOSITIONS[func] = fn
        return fn

    return register


class PreAutogradDecompositions(TorchFunctionMode):
    """Routes the functions of :data:`PRE_AUTOGRAD_DECOMPOSITIONS` to their replacements
    (a call that writes into ``out=`` keeps the function)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        replacement = PRE_AUTOGRAD_DECOMPOSITIONS.get(func)
        if replacement is not None and kwargs.get("out") is None:
            return replacement(*args, **kwargs)
        return func(*args, **kwargs)


@register_pre_autograd(torch.aminmax, torch.Tensor.aminmax)
def aminmax(x: torch.Tensor, *, dim: int | None = None, keepdim: bool = False):
    dims = () if dim is None else dim
    return torch.return_types.aminmax(
        (torch.amin(x, dims, keepdim=keepdim), torch.amax(x, dims, keepdim=keepdim))
    )
