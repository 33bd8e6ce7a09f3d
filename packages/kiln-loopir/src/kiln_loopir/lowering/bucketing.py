"""Lowerings that put values into bins: searchsorted, bucketize (a binary search unrolled
into pointwise steps, one indirect load each) and histc (each element's bin, then a
scatter-add of ones)."""

from __future__ import annotations

import sympy
import torch

from kiln_loopir.ir import GraphInput, TensorRef
from kiln_loopir.lowering.pointwise import loader, promoted_dtype
from kiln_loopir.lowering.registry import register_lowering

aten = torch.ops.aten

# a search over a symbolic number of boundaries takes as many steps as int64 has bits
_SYMBOLIC_SEARCH_STEPS = 63


def _search_steps(n: sympy.Expr) -> int:
    """The iterations of ``while (start < end)`` halving ``[0, n)``: enough to converge."""
    return int(n).bit_length() if n.is_Integer else _SYMBOLIC_SEARCH_STEPS


def binary_search(ops, n, value, probe, right: bool):
    """ATen's lower/upper bound over ``[0, n)``, step for step: ``probe(ops, mid)`` reads
    the boundary at ``mid`` (an int64 value). The same comparisons as eager, so NaN and
    unsorted boundaries give eager's answer too."""
    n = sympy.sympify(n)
    one, two = ops.constant(1, torch.int64), ops.constant(2, torch.int64)
    steps = _search_steps(n)
    if n.is_Integer:
        # the first step's bounds are known: probe the middle, no condition to test
        if n == 0:
            return ops.constant(0, torch.int64)
        mid = ops.constant(int(n) // 2, torch.int64)
        stop = ops.gt(probe(ops, mid), value) if right else ops.ge(probe(ops, mid), value)
        start = ops.where(stop, ops.constant(0, torch.int64), ops.add(mid, one))
        end = ops.where(stop, mid, ops.constant(int(n), torch.int64))
        steps -= 1
    else:
        start, end = ops.constant(0, torch.int64), ops.index_expr(n, torch.int64)
    for _ in range(steps):
        searching = ops.lt(start, end)
        mid = ops.add(start, ops.truncdiv(ops.sub(end, start), two))
        boundary = ops.masked(searching, lambda mid=mid: probe(ops, mid), 0)
        # lower bound: right of mid unless mid >= value; upper bound: unless mid > value
        stop = ops.gt(boundary, value) if right else ops.ge(boundary, value)
        go_right = ops.logical_and(searching, ops.logical_not(stop))
        go_left = ops.logical_and(searching, stop)
        start = ops.where(go_right, ops.add(mid, one), start)
        end = ops.where(go_left, mid, end)
    return start


def _searchsorted(ctx, seq: TensorRef, values, right: bool, out_int32: bool, sorter=None):
    n = seq.size[-1] if seq.size else sympy.S.One
    compare = promoted_dtype(seq, values)
    out = ctx.val
    load_value = loader(values, tuple(sympy.sympify(s) for s in out.shape), compare, ctx)
    rows = len(seq.size) > 1  # one sorted row per leading index of the values

    def inner_fn(ops, index):
        lead = list(index[:-1]) if rows else []

        def probe(ops, mid):
            pos = ops.indirect_indexing(mid, n)
            if sorter is not None:
                pos = ops.indirect_indexing(sorter.load(ops, [*lead, pos]), n)
            return ops.to_dtype(seq.load(ops, [*lead, pos]), compare)

        found = binary_search(ops, n, load_value(ops, index), probe, right)
        return ops.to_dtype(found, torch.int32 if out_int32 else torch.int64)

    return ctx.pointwise(inner_fn)


@register_lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(ctx, seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    return _searchsorted(ctx, seq, values, right, out_int32, sorter)


@register_lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(ctx, values, boundaries, *, out_int32=False, right=False):
    return _searchsorted(ctx, boundaries, values, right, out_int32)


def _bin_edges(ctx, lo: float, hi: float, bins: int, dtype: torch.dtype) -> TensorRef:
    """``linspace(lo, hi, bins + 1)`` as eager's histc makes it, a constant of the graph:
    the bins eager counts into are bounded by exactly these values."""
    edges = torch.linspace(lo, hi, bins + 1, dtype=dtype, device=ctx.device)
    buf = ctx.new_buffer(dtype, ctx.device, (sympy.Integer(bins + 1),))
    ctx.graph.constants.append(GraphInput(buf.name, buffer=buf, value=edges))
    return buf.ref()


def _cpu_bin(ops, x, edges: TensorRef, bins: int, dtype):
    """ATen's CPU histogram bin: the position by division, corrected against the edges
    next to it (upper_bound over at most three), the last edge in the last bin."""
    lo = edges.load(ops, [sympy.S.Zero])
    hi = edges.load(ops, [sympy.Integer(bins)])
    scaled = ops.mul(ops.sub(x, lo), ops.constant(float(bins), dtype))
    guess = ops.to_dtype(ops.truediv(scaled, ops.sub(hi, lo)), torch.int64)
    zero, one = ops.constant(0, torch.int64), ops.constant(1, torch.int64)
    last_edge = ops.constant(bins, torch.int64)
    first = ops.minimum(ops.maximum(zero, ops.sub(guess, one)), last_edge)
    window = ops.sub(ops.minimum(ops.add(guess, ops.constant(2, torch.int64)),
                                 ops.add(last_edge, one)), first)  # fmt: skip

    def probe(ops, k):
        # past the window (cut short at the last edge) the last edge repeats
        at = ops.minimum(ops.add(first, k), last_edge)
        return edges.load(ops, [ops.indirect_indexing(at, sympy.Integer(bins + 1))])

    above = ops.minimum(binary_search(ops, 3, x, probe, right=True), window)
    pos = ops.sub(ops.add(first, above), one)
    return ops.where(ops.eq(pos, last_edge), ops.sub(pos, one), pos)


def _gpu_bin(ops, x, lo: float, hi: float, bins: int, dtype):
    """ATen's CUDA histogram bin: the position by division alone."""
    scaled = ops.mul(ops.sub(x, ops.constant(lo, dtype)), ops.constant(float(bins), dtype))
    pos = ops.to_dtype(ops.truediv(scaled, ops.constant(hi - lo, dtype)), torch.int64)
    last = ops.constant(bins, torch.int64)
    return ops.where(ops.eq(pos, last), ops.sub(pos, ops.constant(1, torch.int64)), pos)


@register_lowering(aten.histc.default)
def histc(ctx, x: TensorRef, bins=100, min=0, max=0):
    dtype = x.dtype
    lo, hi = float(min), float(max)
    if dtype not in (torch.float32, torch.float64) or not lo < hi:
        # a range taken from the data (min == max) eager checks for finiteness first
        raise NotImplementedError("histc lowers with a float range min < max given")
    if isinstance(bins, sympy.Expr) and not bins.is_Integer:
        raise NotImplementedError("histc lowers with a fixed number of bins")
    bins = int(bins)
    counts = ctx.pointwise(lambda ops, index: ops.constant(0.0, dtype))
    buf = ctx.buffer(counts.buffer)
    on_cpu = ctx.device.type == "cpu"
    edges = _bin_edges(ctx, lo, hi, bins, dtype) if on_cpu else None

    def inside(ops, value):
        if edges is not None:
            lo_v, hi_v = edges.load(ops, [sympy.S.Zero]), edges.load(ops, [sympy.Integer(bins)])
        else:
            lo_v, hi_v = ops.constant(lo, dtype), ops.constant(hi, dtype)
        return ops.logical_and(ops.ge(value, lo_v), ops.le(value, hi_v))  # NaN is outside

    def one_if_inside(ops, index):
        inside_now = inside(ops, x.load(ops, index))
        return ops.where(inside_now, ops.constant(1.0, dtype), ops.constant(0.0, dtype))

    def bin_index(ops, index):
        value = x.load(ops, index)
        if edges is not None:
            pos = _cpu_bin(ops, value, edges, bins, dtype)
        else:
            pos = _gpu_bin(ops, value, lo, hi, bins, dtype)
        pos = ops.where(inside(ops, value), pos, ops.constant(0, torch.int64))
        return buf.store_index([ops.indirect_indexing(pos, sympy.Integer(bins))])

    ctx.scatter(counts, x.size, one_if_inside, bin_index, accumulate=True)
    return counts
