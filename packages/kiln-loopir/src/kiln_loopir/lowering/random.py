"""Random numbers from a seed and an offset: rand, randn, bernoulli, dropout.

Each random op reads the graph's seed (one int64 the host program draws per call from
torch's default generator) and uses its stream number and the element's linear index as the
offset, so a kernel computes any element's random value independently of the others.
"""

from __future__ import annotations

import sympy
import torch

from kiln_loopir.lowering.context import LoweringContext, val_layout
from kiln_loopir.lowering.pointwise import compute_dtype, loader
from kiln_loopir.lowering.registry import register_lowering
from kiln_loopir.symbols import contiguous_strides, strided_index

aten = torch.ops.aten


def random_values(ctx: LoweringContext, kind: str):
    """``fn(ops, index)`` giving float32 uniform [0, 1) (``rand``) or normal (``randn``)."""
    seed, stream = ctx.random_seed()
    size, _, _ = val_layout(ctx.val)
    numel = sympy.S.One
    for s in size:
        numel = numel * s
    strides = contiguous_strides(size)

    def value(ops, index):
        s = seed.load(ops, [sympy.S.Zero])
        offset = ops.index_expr(stream * numel + strided_index(index, strides), torch.int64)
        return getattr(ops, kind)(s, offset)

    return value


@register_lowering(aten.rand.default, aten.rand_like.default)
def rand(ctx, *args, **kwargs):
    value = random_values(ctx, "rand")
    return ctx.pointwise(lambda ops, index: ops.to_dtype(value(ops, index), ctx.val.dtype))


@register_lowering(aten.randn.default, aten.randn_like.default)
def randn(ctx, *args, **kwargs):
    value = random_values(ctx, "randn")
    return ctx.pointwise(lambda ops, index: ops.to_dtype(value(ops, index), ctx.val.dtype))


@register_lowering(aten.bernoulli.p, aten.bernoulli.default)
def bernoulli(ctx, x, p=None, *, generator=None):
    value = random_values(ctx, "rand")
    dtype = ctx.val.dtype
    size, _, _ = val_layout(ctx.val)
    load_p = loader(x if p is None else p, size, torch.float32)

    def inner_fn(ops, index):
        return ops.to_dtype(ops.lt(value(ops, index), load_p(ops, index)), dtype)

    return ctx.pointwise(inner_fn)


@register_lowering(aten.native_dropout.default)
def native_dropout(ctx, x, p, train):
    out_val, mask_val = ctx.val
    if not train or p == 0:
        keep = ctx.pointwise(lambda ops, index: ops.constant(True, torch.bool), val=mask_val)
        same = ctx.pointwise(lambda ops, index: x.load(ops, index), val=out_val)
        return same, keep
    saved, ctx.val = ctx.val, mask_val
    value = random_values(ctx, "rand")
    ctx.val = saved
    keep = ctx.pointwise(
        lambda ops, index: ops.ge(value(ops, index), ops.constant(float(p), torch.float32)),
        val=mask_val,
    )
    acc = compute_dtype(x.dtype)

    def inner_fn(ops, index):
        scaled = ops.mul(ops.to_dtype(x.load(ops, index), acc), ops.constant(1.0 / (1 - p), acc))
        kept = keep.load(ops, index)
        return ops.to_dtype(ops.where(kept, scaled, ops.constant(0.0, acc)), out_val.dtype)

    return ctx.pointwise(inner_fn, val=out_val), keep
