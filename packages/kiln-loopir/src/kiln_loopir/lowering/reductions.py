"""Lowerings of reductions: sum, prod, mean, amax/amin, max/min, argmax/argmin, any/all,
var and var_mean (Welford), softmax, log_softmax, logsumexp."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy
import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.context import LoweringContext
from kiln_loopir.lowering.pointwise import broadcast_index, compute_dtype
from kiln_loopir.lowering.registry import register_lowering

aten = torch.ops.aten


def normalize_dims(dims: object, ndim: int) -> list[int]:
    """Reduced dimensions, sorted and non-negative; None or [] means every dimension."""
    if ndim == 0:
        return []  # a 0-d tensor: dim 0 or -1 names the tensor itself, nothing to reduce
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % ndim for d in dims})


def split_index(
    size: Sequence[sympy.Expr], dims: Sequence[int], keepdim: bool, index, rindex
) -> list[sympy.Expr]:
    """The input index for output ``index`` and reduction index ``rindex``."""
    out = iter(index)
    red = iter(rindex)
    full = []
    for d in range(len(size)):
        if d in dims:
            if keepdim:
                next(out)
            full.append(next(red))
        else:
            full.append(next(out))
    return full


def reduce(
    ctx: LoweringContext,
    x: TensorRef,
    dims: object,
    keepdim: bool,
    reduction_type: str,
    *,
    dtype: torch.dtype,
    src_dtype: torch.dtype,
    value_fn: Callable | None = None,
    val: torch.Tensor | None = None,
) -> TensorRef:
    """A Reduction node over ``dims`` of ``x``.

    ``value_fn(ops, input_index, keepdim_index)`` computes the reduced value (default: load
    ``x``); ``val`` gives the output's layout (else contiguous).
    """
    size = list(x.size)
    dims = normalize_dims(dims, len(size))
    if keepdim:
        ranges = [sympy.S.One if d in dims else s for d, s in enumerate(size)]
    else:
        ranges = [s for d, s in enumerate(size) if d not in dims]
    rranges = [size[d] for d in dims]

    def inner_fn(ops, index, rindex):
        full = split_index(size, dims, keepdim, index, rindex)
        if value_fn is None:
            value = x.load(ops, full)
        else:
            kept = [sympy.S.Zero if d in dims else i for d, i in enumerate(full)]
            value = value_fn(ops, full, kept)
        return ops.to_dtype(value, src_dtype)

    return ctx.reduction(
        inner_fn,
        ranges=ranges,
        reduction_ranges=rranges,
        reduction_type=reduction_type,
        dtype=dtype,
        src_dtype=src_dtype,
        val=val,
    )


def _numel(x: TensorRef, dims: Sequence[int]) -> sympy.Expr:
    n = sympy.S.One
    for d in normalize_dims(dims, len(x.size)):
        n = n * x.size[d]
    return n


def _scale(ctx, red: TensorRef, factor_fn, val, src_dtype):
    """A pointwise ``factor_fn(ops, value)`` over the reduction result, with val's layout."""
    return ctx.pointwise(
        lambda ops, index: ops.to_dtype(factor_fn(ops, red.load(ops, index)), val.dtype), val=val
    )


@register_lowering(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, x, dims=None, keepdim=False, *, dtype=None):
    out = ctx.val.dtype
    return reduce(
        ctx, x, dims, keepdim, "sum", dtype=out, src_dtype=compute_dtype(out), val=ctx.val
    )


@register_lowering(aten.prod.dim_int, aten.prod.default)
def prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    out = ctx.val.dtype
    return reduce(
        ctx, x, dim, keepdim, "prod", dtype=out, src_dtype=compute_dtype(out), val=ctx.val
    )


@register_lowering(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def amax_amin(ctx, x, dims=None, keepdim=False):
    kind = "max" if ctx.op.overloadpacket in (aten.amax, aten.max) else "min"
    out = ctx.val.dtype
    return reduce(ctx, x, dims, keepdim, kind, dtype=out, src_dtype=out, val=ctx.val)


@register_lowering(aten.argmax.default, aten.argmin.default)
def argmax_argmin(ctx, x, dim=None, keepdim=False):
    kind = "argmax" if ctx.op.overloadpacket is aten.argmax else "argmin"
    # dim=None reduces every dimension (with keepdim, each becomes 1)
    dims = list(range(len(x.size))) if dim is None else dim
    return reduce(ctx, x, dims, keepdim, kind, dtype=torch.int64, src_dtype=x.dtype, val=ctx.val)


@register_lowering(aten.max.dim, aten.min.dim)
def max_min_dim(ctx, x, dim, keepdim=False):
    kind = "max" if ctx.op.overloadpacket is aten.max else "min"
    values = reduce(ctx, x, dim, keepdim, kind, dtype=x.dtype, src_dtype=x.dtype, val=ctx.val[0])
    indices = reduce(
        ctx, x, dim, keepdim, "arg" + kind, dtype=torch.int64, src_dtype=x.dtype, val=ctx.val[1]
    )
    return values, indices


@register_lowering(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim)
def any_all(ctx, x, dim=None, keepdim=False):
    kind = "any" if ctx.op.overloadpacket is aten.any else "all"
    return reduce(
        ctx, x, dim, keepdim, kind, dtype=ctx.val.dtype, src_dtype=torch.bool, val=ctx.val
    )


@register_lowering(aten.mean.dim, aten.mean.default)
def mean(ctx, x, dims=None, keepdim=False, *, dtype=None):
    val = ctx.val
    acc = compute_dtype(val.dtype)
    total = reduce(ctx, x, dims, keepdim, "sum", dtype=acc, src_dtype=acc)
    n = _numel(x, dims)
    return _scale(ctx, total, lambda ops, v: ops.truediv(v, ops.index_expr(n, acc)), val, acc)


def _var(ctx, x, dims, correction, keepdim, val):
    acc = compute_dtype(val.dtype)
    m2 = reduce(ctx, x, dims, keepdim, "welford.m2", dtype=acc, src_dtype=acc)
    correction = 1 if correction is None else correction
    denom = sympy.Max(0, _numel(x, dims) - sympy.sympify(correction))

    def fn(ops, v):
        return ops.truediv(v, ops.index_expr(denom, acc))

    return m2, fn, acc


@register_lowering(aten.var.correction)
def var(ctx, x, dims=None, *, correction=None, keepdim=False):
    m2, fn, acc = _var(ctx, x, dims, correction, keepdim, ctx.val)
    return _scale(ctx, m2, fn, ctx.val, acc)


@register_lowering(aten.var_mean.correction)
def var_mean(ctx, x, dims=None, *, correction=None, keepdim=False):
    var_val, mean_val = ctx.val
    m2, fn, acc = _var(ctx, x, dims, correction, keepdim, var_val)
    mean_ref = reduce(
        ctx, x, dims, keepdim, "welford.mean", dtype=mean_val.dtype, src_dtype=acc, val=mean_val
    )
    return _scale(ctx, m2, fn, var_val, acc), mean_ref


def _softmax_parts(ctx, x, dim):
    out = ctx.val
    acc = compute_dtype(out.dtype)
    size = list(x.size)

    def load(ops, index):
        return ops.to_dtype(x.load(ops, index), acc)

    amax = reduce(
        ctx, x, [dim], True, "max", dtype=acc, src_dtype=acc,
        value_fn=lambda ops, index, kept: load(ops, index),
    )  # fmt: skip

    def shifted(ops, index):
        return ops.sub(load(ops, index), amax.load(ops, broadcast_index(amax, size, index)))

    total = reduce(
        ctx,
        x,
        [dim],
        True,
        "sum",
        dtype=acc,
        src_dtype=acc,
        value_fn=lambda ops, index, kept: ops.exp(shifted(ops, index)),
    )
    return out, acc, size, shifted, total


@register_lowering(aten._softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
    out, acc, size, shifted, total = _softmax_parts(ctx, x, dim)

    def inner_fn(ops, index):
        s = total.load(ops, broadcast_index(total, size, index))
        return ops.to_dtype(ops.truediv(ops.exp(shifted(ops, index)), s), out.dtype)

    return ctx.pointwise(inner_fn)


@register_lowering(aten._log_softmax.default)
def log_softmax(ctx, x, dim, half_to_float=False):
    out, acc, size, shifted, total = _softmax_parts(ctx, x, dim)

    def inner_fn(ops, index):
        s = total.load(ops, broadcast_index(total, size, index))
        return ops.to_dtype(ops.sub(shifted(ops, index), ops.log(s)), out.dtype)

    return ctx.pointwise(inner_fn)


@register_lowering(aten.logsumexp.default)
def logsumexp(ctx, x, dims, keepdim=False):
    out = ctx.val
    acc = compute_dtype(out.dtype)
    dims = normalize_dims(dims, len(x.size))

    def load(ops, index):
        return ops.to_dtype(x.load(ops, index), acc)

    amax = reduce(
        ctx, x, dims, True, "max", dtype=acc, src_dtype=acc,
        value_fn=lambda ops, index, kept: load(ops, index),
    )  # fmt: skip
    size = list(x.size)

    def safe_max(ops, kept):
        m = amax.load(ops, broadcast_index(amax, size, kept))
        # An all -inf row gives -inf, not nan: shift by 0 where the max is infinite.
        return ops.where(ops.isinf(m), ops.constant(0.0, acc), m)

    total = reduce(
        ctx,
        x,
        dims,
        True,
        "sum",
        dtype=acc,
        src_dtype=acc,
        value_fn=lambda ops, index, kept: ops.exp(ops.sub(load(ops, index), safe_max(ops, kept))),
    )

    def inner_fn(ops, index):
        kept = split_index(size, dims, keepdim, index, [sympy.S.Zero] * len(dims))
        s = total.load(ops, kept)
        return ops.to_dtype(ops.add(ops.log(s), safe_max(ops, kept)), out.dtype)

    return ctx.pointwise(inner_fn)
