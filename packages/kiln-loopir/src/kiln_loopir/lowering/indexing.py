"""Lowerings that move data by index: cat, padding, gather, embedding, advanced indexing,
index_select, flip, and the scatters (scatter, scatter_add, index_put, slice/select_scatter)."""

from __future__ import annotations

import sympy
import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.context import LoweringContext
from kiln_loopir.lowering.pointwise import broadcast_index, compute_dtype, loader
from kiln_loopir.lowering.registry import register_lowering
from kiln_loopir.symbols import FloorDiv

aten = torch.ops.aten


def _idx(ops, expr):
    return ops.index_expr(expr, torch.int64)


def _i64(ops, value):
    return ops.constant(int(value) if isinstance(value, int) else value, torch.int64)


def _in_range(ops, expr, lo, hi):
    """``lo <= expr < hi`` as an ops value (bounds are sympy expressions)."""
    e = _idx(ops, expr)
    return ops.logical_and(ops.ge(e, _idx(ops, lo)), ops.lt(e, _idx(ops, hi)))


@register_lowering(aten.cat.default)
def cat(ctx: LoweringContext, tensors, dim=0):
    out = ctx.val
    dim = dim % len(out.shape)
    parts = []
    start = sympy.S.Zero
    for t in tensors:
        if len(t.size) != len(out.shape):  # the legacy empty 1-D tensor that cat skips
            continue
        parts.append((t, start, start + t.size[dim]))
        start = start + t.size[dim]

    loads = [ctx.inlined_loader(t) for t, _, _ in parts]

    def inner_fn(ops, index):
        result = None
        for (_, lo, hi), load in reversed(list(zip(parts, loads, strict=True))):
            shifted = list(index)
            shifted[dim] = index[dim] - lo

            def body(load=load, shifted=shifted):
                return ops.to_dtype(load(ops, shifted), out.dtype)

            if len(parts) == 1:
                return body()
            mask = _in_range(ops, index[dim], lo, hi)
            value = ops.masked(mask, body, 0)
            result = value if result is None else ops.where(mask, value, result)
        return result

    return ctx.pointwise(inner_fn)


@register_lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx: LoweringContext, x: TensorRef, pad, value=0):
    out = ctx.val
    n = len(x.size)
    lefts = [sympy.S.Zero] * n
    for i in range(len(pad) // 2):
        lefts[n - 1 - i] = sympy.sympify(pad[2 * i])

    load_x = ctx.inlined_loader(x)

    def inner_fn(ops, index):
        src = [i - left for i, left in zip(index, lefts, strict=True)]
        mask = None
        for d in range(n):
            if lefts[d] == 0 and x.size[d] == out.shape[d]:
                continue
            m = _in_range(ops, src[d], sympy.S.Zero, x.size[d])
            mask = m if mask is None else ops.logical_and(mask, m)
        if mask is None:
            return load_x(ops, src)
        fill = loader(value, (), out.dtype)(ops, index)
        return ops.where(mask, ops.masked(mask, lambda: load_x(ops, src), 0), fill)

    return ctx.pointwise(inner_fn)


def _indirect(ops, ref: TensorRef, ref_index, size):
    return ops.indirect_indexing(ref.load(ops, ref_index), size)


@register_lowering(aten.gather.default)
def gather(ctx: LoweringContext, x: TensorRef, dim, index: TensorRef, *, sparse_grad=False):
    dim = dim % max(len(x.size), 1)
    load_x = ctx.inlined_loader(x)

    def inner_fn(ops, idx):
        if not x.size:
            return load_x(ops, [])
        pos = list(idx)
        pos[dim] = _indirect(ops, index, list(idx), x.size[dim])
        return load_x(ops, pos)

    return ctx.pointwise(inner_fn)


@register_lowering(aten.embedding.default)
def embedding(ctx, weight: TensorRef, indices: TensorRef, padding_idx=-1, *_):
    k = len(indices.size)
    load_w = ctx.inlined_loader(weight)

    def inner_fn(ops, idx):
        row = _indirect(ops, indices, list(idx[:k]), weight.size[0])
        return load_w(ops, [row, *idx[k:]])

    return ctx.pointwise(inner_fn)


@register_lowering(aten.index_select.default)
def index_select(ctx, x: TensorRef, dim, index: TensorRef):
    dim = dim % max(len(x.size), 1)

    def inner_fn(ops, idx):
        if not x.size:
            return x.load(ops, [])
        pos = list(idx)
        pos[dim] = _indirect(ops, index, [idx[dim]] if index.size else [], x.size[dim])
        return x.load(ops, pos)

    return ctx.pointwise(inner_fn)


def advanced_index(x: TensorRef, indices) -> tuple[list[sympy.Expr], object]:
    """The result size of ``x[indices]`` and ``fn(ops, out_index) -> x index``."""
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        raise NotImplementedError("boolean-mask indexing has a data-dependent size")
    indices = list(indices) + [None] * (len(x.size) - len(indices))
    used = [d for d, i in enumerate(indices) if i is not None]
    # The index tensors broadcast together: per trailing-aligned dim, the size that is not 1.
    rank = max((len(indices[d].size) for d in used), default=0)
    bsize = []
    for k in range(rank):
        sizes = [
            indices[d].size[len(indices[d].size) - rank + k]
            for d in used
            if len(indices[d].size) - rank + k >= 0
        ]
        non_one = [s for s in sizes if s != 1]
        bsize.append(non_one[0] if non_one else sympy.S.One)
    adjacent = used == list(range(used[0], used[-1] + 1)) if used else True
    pos = used[0] if adjacent and used else 0
    rest = [d for d in range(len(x.size)) if indices[d] is None]
    before = [d for d in rest if d < pos] if adjacent else []
    after = [d for d in rest if d not in before]
    size = [x.size[d] for d in before] + bsize + [x.size[d] for d in after]

    def to_x_index(ops, out_index):
        nb = len(before)
        b_index = list(out_index[nb : nb + rank])
        src = [None] * len(x.size)
        for k, d in enumerate(before):
            src[d] = out_index[k]
        for k, d in enumerate(after):
            src[d] = out_index[nb + rank + k]
        for d in used:
            ref = indices[d]
            ref_index = broadcast_index(ref, bsize, b_index)
            src[d] = _indirect(ops, ref, ref_index, x.size[d])
        return src

    return size, to_x_index


@register_lowering(aten.index.Tensor)
def index(ctx, x: TensorRef, indices):
    _, to_x_index = advanced_index(x, indices)
    load_x = ctx.inlined_loader(x)
    return ctx.pointwise(lambda ops, idx: load_x(ops, to_x_index(ops, idx)))


def _copy_of(ctx, x: TensorRef) -> TensorRef:
    """A fresh buffer holding ``x`` with the output's layout (what scatters write into)."""
    return ctx.pointwise(lambda ops, idx: x.load(ops, idx))


@register_lowering(aten.index_put.default)
def index_put(ctx, x: TensorRef, indices, values, accumulate=False):
    if _is_whole_mask(x, indices, values):
        return _put_where(ctx, x, indices[0], values, accumulate)
    out = _copy_of(ctx, x)
    buf = ctx.buffer(out.buffer)
    size, to_x_index = advanced_index(x, indices)
    load_values = loader(values, size, out.dtype)
    ctx.scatter(
        out,
        size,
        load_values,
        lambda ops, idx: buf.store_index(to_x_index(ops, idx)),
        accumulate,
    )
    return out


def _is_whole_mask(x: TensorRef, indices, values) -> bool:
    """``x[mask] = v`` with a mask of ``x``'s shape and one value: a ``where``."""
    if len(indices) != 1 or not isinstance(indices[0], TensorRef):
        return False
    mask = indices[0]
    one_value = not isinstance(values, TensorRef) or all(s == 1 for s in values.size)
    return mask.dtype == torch.bool and tuple(mask.size) == tuple(x.size) and one_value


def _put_where(ctx, x: TensorRef, mask: TensorRef, values, accumulate: bool) -> TensorRef:
    size, dtype = list(x.size), compute_dtype(ctx.val.dtype)
    load_mask, load_old = loader(mask, size, torch.bool), loader(x, size, dtype)
    value_size = list(values.size) if isinstance(values, TensorRef) else []
    load_new = loader(values, value_size, dtype)  # its one value, at index 0 of every dim

    def inner_fn(ops, index):
        old, new = load_old(ops, index), load_new(ops, [sympy.S.Zero] * len(value_size))
        if accumulate:
            new = ops.add(old, new)
        value = ops.where(load_mask(ops, index), new, old)
        return value if dtype == ctx.val.dtype else ops.to_dtype(value, ctx.val.dtype)

    return ctx.pointwise(inner_fn)


def _scatter(ctx, x, dim, index: TensorRef, src, accumulate):
    out = _copy_of(ctx, x)
    buf = ctx.buffer(out.buffer)
    dim = dim % max(len(x.size), 1)
    if isinstance(src, TensorRef):

        def load_src(ops, idx):
            return ops.to_dtype(src.load(ops, idx), out.dtype)
    else:
        load_src = loader(src, (), out.dtype)

    def index_fn(ops, idx):
        if not x.size:
            return sympy.S.Zero
        pos = list(idx)
        pos[dim] = _indirect(ops, index, list(idx), x.size[dim])
        return buf.store_index(pos)

    ctx.scatter(out, index.size, load_src, index_fn, accumulate)
    return out


@register_lowering(aten.scatter.src, aten.scatter.value)
def scatter(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, accumulate=False)


@register_lowering(aten.scatter_add.default)
def scatter_add(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, accumulate=True)


@register_lowering(aten.slice_scatter.default)
def slice_scatter(ctx, x: TensorRef, src: TensorRef, dim=0, start=None, end=None, step=1):
    n = x.size[dim]
    start = sympy.S.Zero if start is None else sympy.sympify(start)
    end = n if end is None else sympy.sympify(end)
    if start.is_Integer and int(start) < 0:
        start = start + n
    if end.is_Integer and int(end) < 0:
        end = end + n
    start = sympy.Min(sympy.Max(start, 0), n)
    end = sympy.Min(sympy.Max(end, start), n)
    dtype = ctx.val.dtype

    def inner_fn(ops, idx):
        i = idx[dim]
        mask = _in_range(ops, i, start, end)
        if step != 1:
            on_step = ops.eq(ops.remainder(_idx(ops, i - start), _i64(ops, step)), _i64(ops, 0))
            mask = ops.logical_and(mask, on_step)
        pos = list(idx)
        pos[dim] = FloorDiv(i - start, step) if step != 1 else i - start
        inside = ops.masked(mask, lambda: ops.to_dtype(src.load(ops, pos), dtype), 0)
        return ops.where(mask, inside, x.load(ops, idx))

    return ctx.pointwise(inner_fn)


@register_lowering(aten.select_scatter.default)
def select_scatter(ctx, x: TensorRef, src: TensorRef, dim, index):
    n = x.size[dim]
    index = sympy.sympify(index)
    if index.is_Integer and int(index) < 0:
        index = index + n

    def inner_fn(ops, idx):
        mask = ops.eq(_idx(ops, idx[dim]), _idx(ops, index))
        pos = list(idx[:dim]) + list(idx[dim + 1 :])
        inside = ops.masked(mask, lambda: src.load(ops, pos), 0)
        return ops.where(mask, inside, x.load(ops, idx))

    return ctx.pointwise(inner_fn)


@register_lowering(aten.flip.default)
def flip(ctx, x: TensorRef, dims):
    flipped = {d % len(x.size) for d in dims} if x.size else set()
    load_x = ctx.inlined_loader(x)

    def inner_fn(ops, idx):
        pos = [x.size[d] - 1 - i if d in flipped else i for d, i in enumerate(idx)]
        return load_x(ops, pos)

    return ctx.pointwise(inner_fn)
