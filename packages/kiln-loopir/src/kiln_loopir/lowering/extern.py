"""Extern kernels: ops run eagerly through ATen by the host program.

Convolution and attention go to ATen on purpose (their libraries beat generated loops), and
so do matrix products above a size (``matmul.py`` decides); every other op with no lowering
falls back here too, and the first fallback of each op is logged on ``kiln.fallbacks``,
so that a missing lowering is visible.
"""

from __future__ import annotations

import logging

import torch

from kiln_loopir.convolution_relu import CONVOLUTION_RELU
from kiln_loopir.grouped_attention import GROUPED_ATTENTION
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
    CONVOLUTION_RELU,  # a convolution with its bias, residual and ReLU in cuDNN's epilogue
)  # fmt: skip
_LOGGED: set[str] = set()


@register_lowering(*EXTERN_OPS)
def extern(ctx: LoweringContext, *args, **kwargs):
    return ctx.extern(ctx.op, args, kwargs, ctx.val)


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
