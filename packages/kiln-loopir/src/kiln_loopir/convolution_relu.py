"""A 2-D convolution with its bias, an optional residual and a ReLU applied by cuDNN.

``relu(convolution(x, w, bias) + residual)`` is what a ResNet block computes once its batch
norms are folded into the convolutions. Run as it is written, the convolution writes its
output and a second kernel reads it back to add the bias and the residual and apply the
ReLU. ``kiln_loopir::convolution_relu`` is the whole of it as one op: on CUDA, cuDNN's
fused convolution (``aten.cudnn_convolution_relu``, or ``cudnn_convolution_add_relu``
with a residual) applies the rest in the convolution's epilogue. Whether that pays is the
caller's to time per shape: on an H100 with a float32 bias it took 1.3-4x the convolution
alone at ResNet-50's shapes. Elsewhere it runs the convolution, the addition and the ReLU
one after the other.

The bias may be float32 where the convolution is in a narrower type (a batch norm folded
into the convolution leaves its shift so): the sum is then taken in float32 and rounded
once, as eager computes ``(convolution + shift).to(dtype)``. cuDNN's fused forms read
their bias as float32 whatever the convolution's type (given a bfloat16 bias they return
values far off), so on CUDA a bias of another type is converted first.

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
        if bias is not None and bias.dtype != torch.float32:
            bias = bias.float()  # exact: cuDNN's fused forms read a float32 bias
        op, args = cudnn_call(x, weight, bias, residual, stride, padding, dilation, groups)
        out = op(*args)
    else:
        out = F.conv2d(x, weight, None, stride, padding, dilation, groups)
        if bias is not None:
            out = (out + bias.view(-1, 1, 1)).to(x.dtype)  # in float32 where the bias is
        out = torch.relu(out if residual is None else out + residual)
    if list(out.stride()) == list(out_stride):
        return out
    return torch.empty_strided(out.shape, out_stride, dtype=out.dtype, device=out.device).copy_(out)


def cudnn_call(x, weight, bias, residual, stride, padding, dilation, groups) -> tuple:
    """``(ATen op, its arguments)`` of cuDNN's fused convolution for these operands (a bias
    is float32): how the op runs on CUDA, how a graph calls it there, and what Kiln's
    rewrite times."""
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
        x, weight, None, stride, padding, dilation, False, [0, 0], groups
    ).shape  # fmt: skip
    return x.new_empty_strided(shape, out_stride)


CONVOLUTION_RELU = torch.ops.kiln_loopir.convolution_relu.default
