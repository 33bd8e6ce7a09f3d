"""Pooling ops that torch leaves whole, as ops kiln-loopir lowers: the gradient of adaptive
average pooling whose windows tile the input (each input size a multiple of the output's:
global pooling, area interpolation) is average pooling's gradient. Max pooling is in
:mod:`kiln_autograd.max_pooling`."""

from __future__ import annotations

import torch

from kiln_autograd.decompositions import register_decomposition

aten = torch.ops.aten


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
