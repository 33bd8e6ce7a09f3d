"""Lowerings of cumulative ops (cumsum, cumprod, logcumsumexp, cummax, cummin).

Where the code generator renders Scan nodes (``ctx.scans``), each is a Scan along the
dimension: one pass, the producer computed in its inner function. Elsewhere each is a prefix
reduction: element ``i`` of the result reduces the elements ``j <= i`` along the dimension,
the others masked to the reduction's identity. Those fuse with what produces and reads them
like any other reduction, but take ``n`` steps per element for ``n`` along the dimension
where a scan takes one: they are taken only where ``n`` is known and at most
:func:`prefix_reduction_max` for the graph's device; otherwise the op runs through ATen.
"""

from __future__ import annotations

import sympy
import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.pointwise import compute_dtype
from kiln_loopir.lowering.registry import register_lowering

aten = torch.ops.aten

# The longest dimension a cumulative op is lowered along as a prefix reduction, by device
# type. On the CPU one ATen call beats the fused prefix reduction from 8 elements on (cumsum
# of a [512, 8] tensor then a multiplication, one thread: 6.7 us against 19.7 us), and is
# level with it at 4. Elsewhere (Triton) a launch and a round trip through memory cost more
# than short prefixes; not measured yet.
PREFIX_REDUCTION_MAX = {"cpu": 4}
PREFIX_REDUCTION_MAX_ELSEWHERE = 64


def prefix_reduction_max(device: torch.device) -> int:
    return PREFIX_REDUCTION_MAX.get(device.type, PREFIX_REDUCTION_MAX_ELSEWHERE)


def _identity(kind: str, dtype: torch.dtype) -> object:
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    if dtype.is_floating_point:
        return float("-inf") if kind in ("max", "argmax") else float("inf")
    info = torch.iinfo(dtype)
    return info.min if kind in ("max", "argmax") else info.max


def _dim_size(ctx, x: TensorRef, dim: int) -> sympy.Expr:
    n = x.size[dim] if x.size else sympy.S.One
    limit = prefix_reduction_max(ctx.graph_device)
    if not (n.is_Integer and int(n) <= limit):
        raise NotImplementedError(
            f"a cumulative op along a dimension of {n} elements (prefix reductions are "
            f"taken up to {limit} on {ctx.graph_device.type})"
        )
    return n


def prefix_reduction(
    ctx,
    x: TensorRef,
    dim: int,
    kind: str,
    src_dtype: torch.dtype,
    dtype: torch.dtype,
    *,
    value_fn=None,
    newest_first: bool = False,
    val=None,
) -> TensorRef:
    """``out[.., i, ..] = reduce(kind, value_fn(ops, source, index) for j <= i)``, where
    ``source`` is ``index`` with ``j`` along ``dim`` (default: ``x`` there): a Reduction
    over the whole dimension with the elements past ``i`` masked to the identity.
    ``newest_first`` walks ``j = i, i - 1, .., 0`` (an argmax then finds the last of equal
    values, as eager's cummax does)."""
    n = _dim_size(ctx, x, dim)
    size = list(x.size)
    identity = _identity(kind, src_dtype)

    def inner_fn(ops, index, rindex):
        if not size:
            value = x.load(ops, []) if value_fn is None else value_fn(ops, [], [])
            return ops.to_dtype(value, src_dtype)
        i, j = index[dim], rindex[0]
        source = list(index)
        source[dim] = i - j if newest_first else j
        taken = ops.le(ops.index_expr(j, torch.int64), ops.index_expr(i, torch.int64))

        def value():
            v = x.load(ops, source) if value_fn is None else value_fn(ops, source, index)
            return ops.to_dtype(v, src_dtype)

        return ops.where(
            taken, ops.masked(taken, value, identity), ops.constant(identity, src_dtype)
        )

    return ctx.reduction(
        inner_fn,
        ranges=size,
        reduction_ranges=[n],
        reduction_type=kind,
        dtype=dtype,
        src_dtype=src_dtype,
        val=val,
    )


def _dim(x: TensorRef, dim: int) -> int:
    return dim % len(x.size) if x.size else 0


def _scans(ctx, x: TensorRef, dim: int) -> bool:
    """Whether to lower to Scan nodes: the code generator renders them, and there is a
    dimension of more than one element to walk."""
    return ctx.scans and bool(x.size) and x.size[dim] != 1


def scan(ctx, x: TensorRef, dim: int, kind: str, src_dtype, dtype, *, val=None, value_fn=None):
    """A Scan node of ``kind`` over ``value_fn(ops, index)`` (default: ``x``, a pointwise
    producer computed in place) along ``dim``."""
    load = value_fn or ctx.inlined_loader(x)

    def inner_fn(ops, index):
        return ops.to_dtype(load(ops, index), src_dtype)

    size = None if val is not None else x.size
    return ctx.scan(
        inner_fn, dim=dim, scan_type=kind, dtype=dtype, src_dtype=src_dtype, val=val, size=size
    )


@register_lowering(aten.cumsum.default, aten.cumprod.default)
def cumsum_cumprod(ctx, x: TensorRef, dim, *, dtype=None):
    kind = "sum" if ctx.op.overloadpacket is aten.cumsum else "prod"
    out, dim = ctx.val.dtype, _dim(x, dim)
    if _scans(ctx, x, dim):
        return scan(ctx, x, dim, kind, compute_dtype(out), out, val=ctx.val)
    return prefix_reduction(ctx, x, dim, kind, compute_dtype(out), out, val=ctx.val)


@register_lowering(aten.cummax.default, aten.cummin.default)
def cummax_cummin(ctx, x: TensorRef, dim):
    if x.dtype == torch.bool:
        raise NotImplementedError("cummax/cummin of bool tensors")
    kind = "max" if ctx.op.overloadpacket is aten.cummax else "min"
    dim = _dim(x, dim)
    values_val, indices_val = ctx.val
    if _scans(ctx, x, dim):
        load = ctx.inlined_loader(x)  # one producer function for both scans
        values = scan(ctx, x, dim, kind, x.dtype, x.dtype, val=values_val, value_fn=load)
        positions = scan(ctx, x, dim, "arg" + kind, x.dtype, torch.int64, val=indices_val,
                         value_fn=load)  # fmt: skip
        return values, positions
    values = prefix_reduction(ctx, x, dim, kind, x.dtype, x.dtype, val=values_val)
    steps_back = prefix_reduction(
        ctx, x, dim, "arg" + kind, x.dtype, torch.int64, newest_first=True
    )

    def index_fn(ops, index):
        i = ops.index_expr(index[dim] if index else sympy.S.Zero, torch.int64)
        return ops.sub(i, steps_back.load(ops, index))

    return values, ctx.pointwise(index_fn, val=indices_val)


@register_lowering(aten.logcumsumexp.default)
def logcumsumexp(ctx, x: TensorRef, dim):
    out = ctx.val
    acc = compute_dtype(out.dtype)
    dim = _dim(x, dim)
    if _scans(ctx, x, dim):
        return scan(ctx, x, dim, "logsumexp", acc, out.dtype, val=out)
    running_max = prefix_reduction(ctx, x, dim, "max", acc, acc)

    def shift(ops, index):
        m = running_max.load(ops, index)
        # all -inf so far gives -inf, an inf gives inf: shift by 0 where the max is infinite
        return ops.where(ops.isinf(m), ops.constant(0.0, acc), m)

    def shifted_exp(ops, source, index):  # shifted by the maximum at the output's point
        return ops.exp(ops.sub(ops.to_dtype(x.load(ops, source), acc), shift(ops, index)))

    total = prefix_reduction(ctx, x, dim, "sum", acc, acc, value_fn=shifted_exp)

    def inner_fn(ops, index):
        value = ops.add(ops.log(total.load(ops, index)), shift(ops, index))
        return ops.to_dtype(value, out.dtype)

    return ctx.pointwise(inner_fn, val=out)
