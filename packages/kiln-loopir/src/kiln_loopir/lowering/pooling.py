"""Lowerings of average pooling (1-, 2- and 3-d windows over the last dimensions) and of its
gradient, as ATen's CPU kernels define them.

The forward sums each window's elements (read under a mask where the window hangs over
the padding), unrolled into one pointwise node for small windows, a reduction over the
window for larger ones, and divides by the window's divisor. The backward is a gather: each
input element adds up the gradients of the outputs whose windows hold it (at most
``ceil(kernel / stride)`` per dimension), each divided by that output's divisor, so it is
one pointwise node with no atomic writes.

The divisor is ``divisor_override`` when given; else the window's size clipped to the
padded input (``count_include_pad``) or to the input itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import sympy
import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.context import LoweringContext
from kiln_loopir.lowering.pointwise import compute_dtype, out_size
from kiln_loopir.lowering.registry import register_lowering
from kiln_loopir.symbols import FloorDiv

aten = torch.ops.aten

# windows of more elements than this are summed by a reduction, not unrolled
MAX_UNROLLED_WINDOW = 25
# a gradient element gathers from at most this many outputs, else it runs through ATen
MAX_GATHERED_OUTPUTS = 64


@dataclass(frozen=True)
class Window:
    """The pooling window along the ``n`` spatial dimensions (the last ``n`` of the input)."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    ceil_mode: bool
    count_include_pad: bool
    divisor_override: int | None

    @classmethod
    def of(cls, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        kernel = _per_dim(kernel_size, n)
        return cls(
            kernel,
            _per_dim(stride, n) if stride else kernel,
            _per_dim(padding, n),
            bool(ceil_mode),
            bool(count_include_pad),
            divisor_override,
        )

    def constant_divisor(self) -> int | None:
        """The divisor when every window has the same one, else None."""
        if self.divisor_override:
            return int(self.divisor_override)
        if self.count_include_pad and not self.ceil_mode:
            # without ceil_mode every window lies inside the padded input
            return math.prod(self.kernel)
        return None

    def divisor(self, ops, out_index: Sequence[sympy.Expr], sizes, dtype: torch.dtype):
        """The divisor of the window of output ``out_index`` (spatial part) as a ``dtype``
        value, computed as ATen does: window bounds clipped to the padded input, then to the
        input unless padding counts."""
        fixed = self.constant_divisor()
        if fixed is not None:
            return ops.constant(float(fixed), dtype)
        count = None
        for o, k, s, p, size in zip(
            out_index, self.kernel, self.stride, self.padding, sizes, strict=True
        ):
            start = ops.index_expr(o * s - p, torch.int64)
            end = ops.minimum(ops.add(start, _i64(ops, k)), ops.index_expr(size + p, torch.int64))
            if not self.count_include_pad:
                start = ops.maximum(start, _i64(ops, 0))
                end = ops.minimum(end, ops.index_expr(size, torch.int64))
            extent = ops.sub(end, start)
            count = extent if count is None else ops.mul(count, extent)
        return ops.to_dtype(count, dtype)


def _per_dim(value, n: int) -> tuple[int, ...]:
    values = [value] if isinstance(value, int) else list(value)
    if len(values) == 1:
        values = values * n
    return tuple(int(v) for v in values)


def _i64(ops, value: int):
    return ops.constant(int(value), torch.int64)


def _inside(ops, expr: sympy.Expr, hi: sympy.Expr):
    """``0 <= expr < hi`` as an ops value."""
    e = ops.index_expr(expr, torch.int64)
    return ops.logical_and(ops.ge(e, _i64(ops, 0)), ops.lt(e, ops.index_expr(hi, torch.int64)))


def _all(ops, conditions: list):
    out = None
    for c in conditions:
        out = c if out is None else ops.logical_and(out, c)
    return out


def _window_read(ops, x: TensorRef, lead, positions, window: Window, dtype):
    """``x`` at ``lead + positions`` as ``dtype``, zero where a position is padding."""
    sizes = x.size[len(lead) :]
    checks = [
        _inside(ops, pos, size)
        for pos, size, p in zip(positions, sizes, window.padding, strict=True)
        if p > 0 or window.ceil_mode
    ]
    index = [*lead, *positions]
    if not checks:
        return ops.to_dtype(x.load(ops, index), dtype)
    mask = _all(ops, checks)
    return ops.masked(mask, lambda: ops.to_dtype(x.load(ops, index), dtype), 0.0)


def _avg_pool(ctx: LoweringContext, x: TensorRef, window: Window, n: int) -> TensorRef:
    out = ctx.val
    dtype = compute_dtype(out.dtype)
    size = out_size(ctx)
    lead_dims = len(size) - n
    in_sizes = x.size[lead_dims:]

    def starts(index):
        return [
            o * s - p
            for o, s, p in zip(index[lead_dims:], window.stride, window.padding, strict=True)
        ]

    def averaged(ops, index, total):
        divisor = window.divisor(ops, index[lead_dims:], in_sizes, dtype)
        return ops.to_dtype(ops.truediv(total, divisor), out.dtype)

    if math.prod(window.kernel) <= MAX_UNROLLED_WINDOW:

        def inner_fn(ops, index):
            lead, first = index[:lead_dims], starts(index)
            total = None
            for offsets in _offsets(window.kernel):
                positions = [f + o for f, o in zip(first, offsets, strict=True)]
                value = _window_read(ops, x, lead, positions, window, dtype)
                total = value if total is None else ops.add(total, value)
            return averaged(ops, index, total)

        return ctx.pointwise(inner_fn)

    def window_value(ops, index, rindex):
        positions = [f + r for f, r in zip(starts(index), rindex, strict=True)]
        return _window_read(ops, x, index[:lead_dims], positions, window, dtype)

    sums = ctx.reduction(
        window_value,
        ranges=size,
        reduction_ranges=window.kernel,
        reduction_type="sum",
        dtype=dtype,
        src_dtype=dtype,
    )
    return ctx.pointwise(lambda ops, index: averaged(ops, index, sums.load(ops, index)))


def _offsets(extents: Sequence[int]) -> list[tuple[int, ...]]:
    found: list[tuple[int, ...]] = [()]
    for extent in extents:
        found = [(*f, i) for f in found for i in range(extent)]
    return found


def _avg_pool_backward(
    ctx: LoweringContext, grad: TensorRef, x: TensorRef, window: Window, n: int
) -> TensorRef:
    out = ctx.val
    dtype = compute_dtype(out.dtype)
    lead_dims = len(x.size) - n
    in_sizes, out_sizes = x.size[lead_dims:], grad.size[lead_dims:]
    # how many windows along each dimension can hold one input element
    reach = [-(-k // s) for k, s in zip(window.kernel, window.stride, strict=True)]
    if math.prod(reach) > MAX_GATHERED_OUTPUTS:
        raise NotImplementedError(f"each element gathers from {math.prod(reach)} windows")

    def inner_fn(ops, index):
        lead, spatial = index[:lead_dims], index[lead_dims:]
        # the last window holding each element, then the ones before it
        last = [
            FloorDiv(i + p, s)
            for i, p, s in zip(spatial, window.padding, window.stride, strict=True)
        ]
        total = None
        for back in _offsets(reach):
            outs = [q - b for q, b in zip(last, back, strict=True)]
            checks = []
            for d, o in enumerate(outs):
                if back[d] > 0 or window.stride[d] > window.kernel[d]:
                    # the window must reach the element (strides past the kernel leave gaps)
                    start = o * window.stride[d] - window.padding[d]
                    checks.append(ops.gt(
                        ops.index_expr(start + window.kernel[d], torch.int64),
                        ops.index_expr(spatial[d], torch.int64),
                    ))  # fmt: skip
                checks.append(_inside(ops, o, out_sizes[d]))
            mask = _all(ops, checks)

            def share(outs=outs):
                g = ops.to_dtype(grad.load(ops, [*lead, *outs]), dtype)
                return ops.truediv(g, window.divisor(ops, outs, in_sizes, dtype))

            value = ops.masked(mask, share, 0.0)
            total = value if total is None else ops.add(total, value)
        return ops.to_dtype(total, out.dtype)

    return ctx.pointwise(inner_fn)


@register_lowering(aten.avg_pool2d.default)
def avg_pool2d(
    ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
    divisor_override=None,
):  # fmt: skip
    window = Window.of(2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override)  # fmt: skip
    return _avg_pool(ctx, x, window, 2)


@register_lowering(aten.avg_pool3d.default)
def avg_pool3d(
    ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
    divisor_override=None,
):  # fmt: skip
    window = Window.of(3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override)  # fmt: skip
    return _avg_pool(ctx, x, window, 3)


@register_lowering(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(
    ctx, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    window = Window.of(2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override)  # fmt: skip
    return _avg_pool_backward(ctx, grad, x, window, 2)


@register_lowering(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(
    ctx, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    window = Window.of(3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override)  # fmt: skip
    return _avg_pool_backward(ctx, grad, x, window, 3)
