"""The lowering registry: aten op -> function that builds IR for it.

Each lowering module fills the table for the ops it owns with ``@register_lowering(op)``.
A lowering is called as ``fn(ctx, *args, **kwargs)`` with the FX node's arguments, where
tensor arguments arrive as :class:`~kiln_loopir.ir.TensorRef` and SymInts as sympy
expressions; it returns a TensorRef (or a tuple of them for a multi-output op).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LoweringFn = Callable[..., object]
LOWERINGS: dict[object, LoweringFn] = {}


def register_lowering(*ops: object) -> Callable[[LoweringFn], LoweringFn]:
    """Register the decorated function for each op (an OpOverload or a whole OpOverloadPacket)."""

    def decorate(fn: LoweringFn) -> LoweringFn:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"{op} already has a lowering ({LOWERINGS[op].__qualname__})")
            LOWERINGS[op] = fn
        return fn

    return decorate


def find_lowering(op: object) -> LoweringFn | None:
    """The lowering for ``op``: its own entry, else its packet's, else None."""
    if op in LOWERINGS:
        return LOWERINGS[op]
    packet = getattr(op, "overloadpacket", None)
    if packet is not None and packet in LOWERINGS:
        return LOWERINGS[packet]
    return None


def is_view_op(op: object) -> bool:
    """Whether ``op`` returns an alias of its first input (its schema says so)."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    schema = op._schema
    if not schema.returns or not schema.arguments:
        return False
    first = schema.arguments[0].alias_info
    ret = schema.returns[0].alias_info
    return first is not None and ret is not None and not first.is_write and not ret.is_write


def lowered_ops() -> list[str]:
    """Names of the ops with a lowering, sorted (for docs and the lowering table)."""
    return sorted(str(op) for op in LOWERINGS)
