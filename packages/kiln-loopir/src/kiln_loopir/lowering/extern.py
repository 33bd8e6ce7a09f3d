"""Extern kernels: ops run eagerly through ATen by the host program.

Convolution and attention go to ATen on purpose (their libraries beat generated loops), and
so do matrix products above a size (``matmul.py`` decides); every other op with no lowering
falls back here too, and the first fallback of each op is logged on ``kiln.fallbacks``,
so that a missing lowering is visible.
"""

from __future__ import annotations

import logging

import sympy
import torch

from kiln_loopir.convolution_relu import CONVOLUTION_RELU, cudnn_call
from kiln_loopir.grouped_attention import GROUPED_ATTENTION
from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.context import LoweringContext
from kiln_loopir.lowering.registry import register_lowering

log = logging.getLogger("kiln.fallbacks")
aten = torch.ops.aten

EXTERN_OPS = (
    aten.convolution.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten.scaled_dot_product_attention.default,
    aten._addmm_activation.default,  # a product with its activation in cuBLASLt's epilogue
    GROUPED_ATTENTION,  # keys and values with fewer heads than the queries
)  # fmt: skip
_LOGGED: set[str] = set()


@register_lowering(*EXTERN_OPS)
def extern(ctx: LoweringContext, *args, **kwargs):
    return ctx.extern(ctx.op, args, kwargs, ctx.val)


@register_lowering(CONVOLUTION_RELU)
def convolution_relu(ctx: LoweringContext, x, weight, bias, residual, *rest):
    """On CUDA, cuDNN's fused convolution as the ATen op itself (a host program calls it
    with no Python in between), where its own output layout is the one asked for and the
    bias (if any) is float32; else the op, which converts the bias and copies into that
    layout (and runs three ATen ops in turn off CUDA)."""
    stride, padding, dilation, groups, out_stride = rest
    float_bias = bias is None or bias.dtype == torch.float32  # as cuDNN's fused forms read it
    cudnn_layout = _cudnn_layout(x, weight, ctx.val) == tuple(out_stride)
    if ctx.val.device.type == "cuda" and float_bias and cudnn_layout:
        op, args = cudnn_call(x, weight, bias, residual, stride, padding, dilation, groups)
        return ctx.extern(op, args, {}, ctx.val)
    return ctx.extern(ctx.op, (x, weight, bias, residual, *rest), {}, ctx.val)


def _cudnn_layout(x, weight, out: torch.Tensor) -> tuple | None:
    """The strides cuDNN's fused convolution gives ``out``: channels-last where the input or
    the weight is laid out so, else contiguous; None where a layout is ambiguous (a
    dimension of 1 makes both fit) or not static."""
    if not all(isinstance(t, TensorRef) for t in (x, weight)):
        return None
    formats = [_memory_format(t.size, t.stride) for t in (x, weight)]
    if None in formats:
        return None
    size = [int(n) for n in out.shape]
    if _memory_format(size, _dense(size, channels_last=False)) is None:
        return None  # the output's own strides would be ambiguous
    return _dense(size, channels_last="channels_last" in formats)


def _memory_format(size, stride) -> str | None:
    """ "contiguous" or "channels_last" for a 4-d static layout that is exactly one of them."""
    if len(size) != 4 or not all(sympy.sympify(n).is_Integer for n in (*size, *stride)):
        return None
    size, stride = [int(n) for n in size], tuple(int(s) for s in stride)
    fits = [
        name
        for name, last in (("contiguous", False), ("channels_last", True))
        if _same(size, stride, _dense(size, channels_last=last))
    ]
    return fits[0] if len(fits) == 1 else None


def _dense(size: list[int], channels_last: bool) -> tuple[int, ...]:
    n, c, h, w = size
    return (h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)


def _same(size: list[int], stride: tuple, dense: tuple) -> bool:
    """Whether ``stride`` is ``dense`` wherever it matters (not along a dimension of 1)."""
    return all(n == 1 or s == d for n, s, d in zip(size, stride, dense, strict=True))


def fallback(ctx: LoweringContext, *args, **kwargs):
    """Run an op that has no lowering through ATen; log the first time per op."""
    name = str(ctx.op)
    if name not in _LOGGED:
        _LOGGED.add(name)
        log.info("no lowering for %s: it runs eagerly through ATen (extern fallback)", name)
    return ctx.extern(ctx.op, args, kwargs, ctx.val)


def logged_fallbacks() -> list[str]:
    """The ops that fell back to ATen in this process so far, sorted."""
    return sorted(_LOGGED)
