"""Lowerings of matrix products: mm, addmm, bmm, baddbmm.

A product big enough for BLAS to pay for its call runs through ATen (an extern step). A
small one on the CPU (``m * n * k`` up to :data:`INLINE_MATMUL_MAX_MNK`) is lowered to a
sum over ``k`` of ``a[m, k] * b[k, n]`` instead: a Reduction whose inner function does the
multiply (no ``[m, k, n]`` intermediate), so that the bias, the activation and the
pointwise ops after it fuse into the same generated kernel. On a tiny model the ATen
call's dispatch costs more than its arithmetic.
"""

from __future__ import annotations

import sympy
import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.context import LoweringContext
from kiln_loopir.lowering.pointwise import broadcast_index, compute_dtype
from kiln_loopir.lowering.registry import register_lowering

aten = torch.ops.aten

# A product of at most this many multiply-adds (m * n * k, times the batch for bmm) is
# lowered to a reduction on the CPU; 0 keeps every product an ATen call. Measured with one
# thread (AVX2, g++ 12; linear + relu against the ATen call and the kernel after it): a
# vector-matrix product (m = 1) wins 1.7-1.8x up to 256 x 256, 4 x 64 x 64 wins 1.5x,
# 16 x 64 x 64 (2^16) breaks even, and 32 x 64 x 64 runs 1.5x slower: the generated loops
# (a dot product per output, or lanes over n) do not block for registers as BLAS does.
INLINE_MATMUL_MAX_MNK = 2**16
# ... and a reduction longer than this stays an ATen call (one long dot product per output
# runs on one thread).
INLINE_MATMUL_MAX_K = 4096
INLINE_MATMUL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def inline_matmul(ctx: LoweringContext, a: TensorRef, b: TensorRef) -> bool:
    """Whether ``a @ b`` (batched when they have three dimensions) is lowered to a
    reduction: on the CPU, for float32 and half types (summed in float, as eager's CPU
    kernels do), with sizes known at compile time and a small product."""
    if ctx.graph_device.type != "cpu" or a.device.type != "cpu" or b.device.type != "cpu":
        return False
    if a.dtype not in INLINE_MATMUL_DTYPES or b.dtype != a.dtype:
        return False
    sizes = [*a.size, b.size[-1]]
    if not all(isinstance(s, sympy.Integer) for s in sizes):
        return False  # symbolic sizes: one compiled graph serves sizes BLAS may suit
    k = int(a.size[-1])
    work = 1
    for s in sizes:
        work *= int(s)
    return 0 < k <= INLINE_MATMUL_MAX_K and 0 < work <= INLINE_MATMUL_MAX_MNK


def matmul_reduction(
    ctx: LoweringContext, a: TensorRef, b: TensorRef, *, dtype: torch.dtype, val=None
) -> TensorRef:
    """``out[..., m, n] = sum_k a[..., m, k] * b[..., k, n]`` as one Reduction over ``k``
    (leading batch dimensions taken together), computed and summed in ``a``'s compute
    dtype and stored as ``dtype`` (with ``val``'s layout when given)."""
    acc = compute_dtype(a.dtype)
    *batch, m, _ = a.size
    n = b.size[-1]

    def inner_fn(ops, index, rindex):
        *bi, mi, ni = index
        (k,) = rindex
        x = ops.to_dtype(a.load(ops, [*bi, mi, k]), acc)
        y = ops.to_dtype(b.load(ops, [*bi, k, ni]), acc)
        return ops.mul(x, y)

    return ctx.reduction(
        inner_fn,
        ranges=[*batch, m, n],
        reduction_ranges=[a.size[-1]],
        reduction_type="dot",  # summed in float, as eager's CPU kernels do
        dtype=dtype,
        src_dtype=acc,
        val=val,
    )


def _add_bias(ctx: LoweringContext, bias: object, product: TensorRef, beta, alpha) -> TensorRef:
    """``beta * bias + alpha * product`` rounded once to the output dtype (``bias`` is
    broadcast; with ``beta == 0`` it is not read, as eager ignores it, NaNs included)."""
    out = ctx.val
    acc = product.dtype
    size = list(product.size)

    def inner_fn(ops, index):
        value = product.load(ops, index)
        if alpha != 1:
            value = ops.mul(value, ops.constant(float(alpha), acc))
        if beta != 0 and isinstance(bias, TensorRef):
            term = ops.to_dtype(bias.load(ops, broadcast_index(bias, size, index)), acc)
            if beta != 1:
                term = ops.mul(term, ops.constant(float(beta), acc))
            value = ops.add(term, value)
        elif beta != 0:
            value = ops.add(ops.constant(float(beta * bias), acc), value)
        return ops.to_dtype(value, out.dtype)

    return ctx.pointwise(inner_fn)


@register_lowering(aten.mm.default, aten.bmm.default)
def mm(ctx: LoweringContext, a, b):
    if not inline_matmul(ctx, a, b):
        return ctx.extern(ctx.op, (a, b), ctx.kwargs, ctx.val)
    return matmul_reduction(ctx, a, b, dtype=ctx.val.dtype, val=ctx.val)


@register_lowering(aten.addmm.default, aten.baddbmm.default)
def addmm(ctx: LoweringContext, bias, a, b, *, beta=1, alpha=1):
    numbers = all(isinstance(s, (int, float)) for s in (beta, alpha))
    if not numbers or not inline_matmul(ctx, a, b):
        return ctx.extern(ctx.op, (bias, a, b), ctx.kwargs, ctx.val)
    product = matmul_reduction(ctx, a, b, dtype=compute_dtype(ctx.val.dtype))
    return _add_bias(ctx, bias, product, beta, alpha)
