"""Max pooling with its indices, and its gradient, as ops kiln-loopir fuses (on every torch
version: torch's own decompositions of these ops came in 2.13).

The forward walks the window's positions in ATen's order and keeps, per output, the largest
value and its position as ATen's kernels pick them: a later element replaces the kept one if
it is larger or NaN (the first of equal maxima stays, the last NaN wins), starting from the
window's first position inside the input with the lowest value of the dtype. Each window
position is one strided view of the input padded with that lowest value, so the whole
forward is one pointwise kernel. An index is the flat position within a channel's
spatial volume. The gradient is a scatter-add of the output gradient to those positions.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch._prims_common import suggest_memory_format

from kiln_autograd.decompositions import register_decomposition

aten = torch.ops.aten


def pooled_size(size, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool):
    """The output size of pooling one dimension of ``size`` elements (ATen's rule: in ceil
    mode the last window starts inside the input or its left padding)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out = out - 1
    return out


def _expand(value, n_dim: int, default=None) -> list:
    if isinstance(value, int):
        return [value] * n_dim
    value = list(value)
    if not value:
        return list(default)
    return value * n_dim if len(value) == 1 else value


def _lowest(dtype: torch.dtype) -> float | int:
    if dtype.is_floating_point:
        return -math.inf
    if dtype is torch.bool:
        return False
    return torch.iinfo(dtype).min


def max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, n_dim: int):
    """The values and indices of ``n_dim``-d max pooling of ``x`` (see the module docstring)."""
    kernel = _expand(kernel_size, n_dim)
    stride = _expand(stride, n_dim, default=kernel)
    padding = _expand(padding, n_dim)
    dilation = _expand(dilation, n_dim)
    sizes = list(x.shape[-n_dim:])
    outs = [
        pooled_size(sizes[d], kernel[d], stride[d], padding[d], dilation[d], ceil_mode)
        for d in range(n_dim)
    ]
    lowest = _lowest(x.dtype)
    pads = []
    for d in reversed(range(n_dim)):  # constant_pad_nd takes the last dimension first
        needed = (outs[d] - 1) * stride[d] + (kernel[d] - 1) * dilation[d] + 1
        pads += [padding[d], torch.sym_max(needed - sizes[d] - padding[d], padding[d])]
    padded = aten.constant_pad_nd(x, pads, lowest)

    # per dimension, each output's first input position, and its first one inside the input
    # (a window may start in the left padding)
    starts, firsts = [], []
    for d in range(n_dim):
        shape = [1] * n_dim
        shape[d] = outs[d]
        start = (torch.arange(outs[d], device=x.device) * stride[d] - padding[d]).reshape(shape)
        skipped = (-start).clamp_min(0)
        first = start + (skipped + dilation[d] - 1) // dilation[d] * dilation[d]
        starts.append(start)
        firsts.append(first)
    index = firsts[0]
    base = starts[0]
    for d in range(1, n_dim):
        index = index * sizes[d] + firsts[d]
        base = base * sizes[d] + starts[d]

    best = torch.full(x.shape[:-n_dim] + tuple(outs), lowest, dtype=x.dtype, device=x.device)
    for offsets in itertools.product(*(range(k) for k in kernel)):
        window = (Ellipsis,) + tuple(
            slice(k * dilation[d], k * dilation[d] + (outs[d] - 1) * stride[d] + 1, stride[d])
            for d, k in enumerate(offsets)
        )
        value = padded[window]
        flat_offset = 0
        for d, k in enumerate(offsets):
            flat_offset = flat_offset * sizes[d] + k * dilation[d]
        take = (value > best) | value.isnan()
        best = torch.where(take, value, best)
        index = torch.where(take, base + flat_offset, index)
    index = index.expand(best.shape)
    layout = suggest_memory_format(x)
    return best.contiguous(memory_format=layout), index.contiguous(memory_format=layout)


@register_decomposition(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@register_decomposition(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


def max_pool_with_indices_backward(grad_output, x, indices, n_dim: int):
    """The gradient of ``n_dim``-d max pooling: ``grad_output`` added at ``indices``."""
    channels = x.shape[:-n_dim]
    volume = math.prod(x.shape[-n_dim:])
    # half precision sums in float32, as ATen's kernel accumulates
    dtype = torch.float32 if grad_output.dtype in (torch.float16, torch.bfloat16) else None
    grad = grad_output.reshape(*channels, -1).to(dtype or grad_output.dtype)
    flat = torch.zeros((*channels, volume), dtype=grad.dtype, device=grad.device)
    flat = flat.scatter_add(-1, indices.reshape(*channels, -1), grad)
    out = flat.reshape(x.shape).to(grad_output.dtype)
    return out.contiguous(memory_format=suggest_memory_format(x))


@register_decomposition(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(
    grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return max_pool_with_indices_backward(grad_output, x, indices, 2)


@register_decomposition(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(
    grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return max_pool_with_indices_backward(grad_output, x, indices, 3)
