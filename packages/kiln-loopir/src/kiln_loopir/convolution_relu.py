"""A 2-D convolution with its bias, an optional residual and a ReLU applied by cuDNN.

``relu(convolution(x, w, bias) + residual)`` is what a ResNet block computes once its batch
norms are folded into the convolutions. Run as it is written, the convolution writes its
output and a second kernel reads it back to add the bias and the residual and apply the
ReLU. ``kiln_loopir::convolution_relu`` is the whole of it as one op: on CUDA, cuDNN's
fused convolution (``aten.cudnn_convolution_relu``, or ``cudnn_convolution_add_relu``
with a residual) applies the rest in the convolution's epilogue, which on an H100 costs
about what the convolution alone does. Elsewhere it runs the convolution, the addition and
the ReLU one after the other.

The output is laid out with the strides the op is given (``out_stride``: those of the ReLU
it replaces), so a graph's views of it keep theirs. On CUDA a graph calls cuDNN's ATen op
itself where that is its own layout (``lowering/extern.py``). Forward only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

aten = torch.ops.aten


@torch.library.custom_op("kiln_loopir::convolution_relu", mutates_args=())
def convolution_relu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    out_stride: list[int],
) -> torch.Tensor:
    """``relu(conv2d(x, weight, bias) + residual)`` (no residual where None)."""
    if x.is_cuda and torch.backends.cudnn.is_available():
        op, args = cudnn_call(x, weight, bias, residual, stride, padding, dilation, groups)
        out = op(*args)
    else:
        out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        out = torch.relu(out if residual is None else out + residual)
    if list(out.stride()) == list(out_stride):
        return out
    return torch.empty_strided(out.shape, out_stride, dtype=out.dtype, device=out.device).copy_(out)


def cudnn_call(x, weight, bias, residual, stride, padding, dilation, groups) -> tuple:
    """``(ATen op, its arguments)`` of cuDNN's fused convolution for these operands: how the
    op runs on CUDA, how a graph calls it there, and what Kiln's rewrite times."""
    if residual is None:
        return aten.cudnn_convolution_relu.default, (
            x, weight, bias, stride, padding, dilation, groups,
        )  # fmt: skip
    return aten.cudnn_convolution_add_relu.default, (
        x, weight, residual, 1.0, bias, stride, padding, dilation, groups,
    )  # fmt: skip


@convolution_relu.register_fake
def _(x, weight, bias, residual, stride, padding, dilation, groups, out_stride):
    torch._check(
        x.dim() == 4 and weight.dim() == 4,
        lambda: "convolution_relu: a 2-D convolution takes 4-d inputs and weights",
    )
    shape = aten.convolution(
        x, weight, bias, stride, padding, dilation, False, [0, 0], groups
    ).shape  # fmt: skip
    return x.new_empty_strided(shape, out_stride)


CONVOLUTION_RELU = torch.ops.kiln_loopir.convolution_relu.default
