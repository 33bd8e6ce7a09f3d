"""Lowerings of cumulative ops (cumsum, cumprod, logcumsumexp, cummax, cummin) as Scan
nodes: one pass along the dimension, a pointwise producer computed in the scan's inner
function. The code generator must render scans (``renders_scans``: kiln-cpp, kiln-triton,
the reference); for one that does not, the op runs through ATen. The scan of a single
element (a 0-d tensor, a dimension of size 1) is that element: a pointwise node.
"""

from __future__ import annotations

import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.pointwise import compute_dtype
from kiln_loopir.lowering.registry import register_lowering

aten = torch.ops.aten


def scan(ctx, x: TensorRef, dim: int, kind: str, src_dtype, val, *, load=None) -> TensorRef:
    """A Scan node of ``kind`` over ``load(ops, index)`` (default: ``x``, a pointwise
    producer computed in place) along ``dim``, with ``val``'s layout and dtype."""
    load = load or ctx.inlined_loader(x)
    if not x.size or x.size[dim] == 1:  # one element along the dimension: itself
        if kind in ("argmax", "argmin"):
            return ctx.pointwise(lambda ops, index: ops.constant(0, torch.int64), val=val)
        return ctx.pointwise(lambda ops, index: ops.to_dtype(load(ops, index), val.dtype), val=val)
    if not ctx.scans:
        raise NotImplementedError("the code generator renders no scans")

    def inner_fn(ops, index):
        return ops.to_dtype(load(ops, index), src_dtype)

    return ctx.scan(
        inner_fn, dim=dim, scan_type=kind, dtype=val.dtype, src_dtype=src_dtype, val=val
    )


def _dim(x: TensorRef, dim: int) -> int:
    return dim % len(x.size) if x.size else 0


@register_lowering(aten.cumsum.default, aten.cumprod.default)
def cumsum_cumprod(ctx, x: TensorRef, dim, *, dtype=None):
    kind = "sum" if ctx.op.overloadpacket is aten.cumsum else "prod"
    return scan(ctx, x, _dim(x, dim), kind, compute_dtype(ctx.val.dtype), ctx.val)


@register_lowering(aten.cummax.default, aten.cummin.default)
def cummax_cummin(ctx, x: TensorRef, dim):
    if x.dtype == torch.bool:
        raise NotImplementedError("cummax/cummin of bool tensors")
    kind = "max" if ctx.op.overloadpacket is aten.cummax else "min"
    dim = _dim(x, dim)
    values_val, indices_val = ctx.val
    load = ctx.inlined_loader(x)  # one producer function for both scans
    values = scan(ctx, x, dim, kind, x.dtype, values_val, load=load)
    positions = scan(ctx, x, dim, "arg" + kind, x.dtype, indices_val, load=load)
    return values, positions


@register_lowering(aten.logcumsumexp.default)
def logcumsumexp(ctx, x: TensorRef, dim):
    return scan(ctx, x, _dim(x, dim), "logsumexp", compute_dtype(ctx.val.dtype), ctx.val)
