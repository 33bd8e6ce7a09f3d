"""The key a CUDA graph is recorded under: what of the inputs a replay cannot change."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def input_key(inputs: Sequence[object], keyed: Sequence[int] | None = None) -> tuple:
    """Shape, stride, dtype and device of every tensor input and the value of every other
    input (of the inputs ``keyed`` only, where given: the caller's guards pin the others):
    calls with equal keys can replay one graph.

    Raises ``TypeError`` naming the input when a non-tensor input cannot be a dict key.
    """
    if keyed is not None:
        return (len(inputs), *(_key_of(i, inputs[i]) for i in keyed))
    return tuple(_key_of(i, x) for i, x in enumerate(inputs))


def _key_of(index: int, x: object) -> tuple:
    if isinstance(x, torch.Tensor):
        return ("tensor", x.shape, x.stride(), x.dtype, x.device)
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        x = _concrete(x)
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"input {index} ({type(x).__name__}) cannot key a CUDA graph: it is not hashable"
        ) from None
    return (type(x), x)  # the type keeps True apart from 1 and 1.0


def _concrete(x: torch.SymInt | torch.SymFloat | torch.SymBool) -> object:
    kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(x)]
    return kind(x)


def tensor_pointers(inputs: Sequence[object]) -> dict[int, int]:
    """Input index -> data pointer, for every tensor input."""
    return {i: x.data_ptr() for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
