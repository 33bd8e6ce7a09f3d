"""Pooling ops that torch leaves whole, as ops kiln-loopir lowers: the gradient of 3-d max
pooling is a scatter-add of the output gradient to the positions its indices name (the
flat position within each channel's volume, as the forward records it); the gradient of
adaptive average pooling whose windows tile the input (each input size a multiple of the
output's: global pooling, area interpolation) is average pooling's gradient."""

from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

from kiln_autograd.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(
    grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    channels = x.shape[:-3]
    volume = x.shape[-3] * x.shape[-2] * x.shape[-1]
    # half precision sums in float32, as ATen's kernel accumulates
    dtype = torch.float32 if grad_output.dtype in (torch.float16, torch.bfloat16) else None
    grad = grad_output.reshape(*channels, -1).to(dtype or grad_output.dtype)
    flat = torch.zeros((*channels, volume), dtype=grad.dtype, device=grad.device)
    flat = flat.scatter_add(-1, indices.reshape(*channels, -1), grad)
    out = flat.reshape(x.shape).to(grad_output.dtype)
    return out.contiguous(memory_format=suggest_memory_format(x))


@register_decomposition(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, x):
    sizes, out_sizes = x.shape[-2:], grad_output.shape[-2:]
    if any(
        not isinstance(n, int) or not isinstance(m, int)
        for n, m in zip(sizes, out_sizes, strict=True)
    ):
        return NotImplemented  # symbolic sizes: whether windows tile is not known here
    if any(n % m for n, m in zip(sizes, out_sizes, strict=True)):
        return NotImplemented  # windows of varying sizes keep ATen's kernel
    kernel = [n // m for n, m in zip(sizes, out_sizes, strict=True)]
    return aten.avg_pool2d_backward(grad_output, x, kernel, kernel, [0, 0], False, True, None)
