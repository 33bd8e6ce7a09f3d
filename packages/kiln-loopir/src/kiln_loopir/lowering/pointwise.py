"""Lowerings of pointwise math: unary, binary, comparison, logical, where, clamp, casts,
activations, and the constant makers (full, arange, scalar_tensor)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy
import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.context import LoweringContext
from kiln_loopir.lowering.registry import register_lowering

aten = torch.ops.aten
LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Low-precision floats are computed in float32, as eager's CPU kernels do."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


@dataclass(frozen=True, eq=False)
class NumberRef(TensorRef):
    """A float read from tensor data (``t.item()``) used as an operand: kernels load it from
    the tensor (as a 0-d view), type promotion counts it as the Python float it is."""


def promoted_dtype(*args: object) -> torch.dtype:
    """The dtype eager's type promotion gives ``args`` (TensorRefs, numbers, sizes)."""
    proxies = []
    for a in args:
        if isinstance(a, NumberRef):
            proxies.append(1.0)
        elif isinstance(a, TensorRef):
            proxies.append(torch.empty((1,) if a.size else (), dtype=a.dtype))
        elif isinstance(a, sympy.Expr):
            proxies.append(1)
        elif isinstance(a, (bool, int, float, complex)):
            proxies.append(a)
    out = proxies[0] if isinstance(proxies[0], torch.Tensor) else torch.tensor(proxies[0])
    for p in proxies[1:]:
        out = torch.empty((1,), dtype=torch.result_type(out, p))
    return out.dtype


def broadcast_index(
    ref: TensorRef, out_size: Sequence[sympy.Expr], index: Sequence[sympy.Expr]
) -> list[sympy.Expr]:
    """The index into ``ref`` that element ``index`` of the broadcast output reads."""
    lead = len(index) - len(ref.size)
    return [
        sympy.S.Zero if (s == 1 and out_size[lead + i] != 1) else index[lead + i]
        for i, s in enumerate(ref.size)
    ]


def loader(
    arg: object,
    out_size: Sequence[sympy.Expr],
    dtype: torch.dtype | None,
    ctx: LoweringContext | None = None,
) -> Callable:
    """``fn(ops, index)`` reading ``arg`` (tensor, number or size) broadcast to ``out_size``.

    The value is converted to ``dtype`` when one is given. With ``ctx``, a Pointwise
    producer read through a permuting view is computed in place of the load.
    """
    if isinstance(arg, TensorRef):
        read = arg.load  # a plain read of a whole buffer: fusion handles it
        if ctx is not None and not _whole(ctx, arg):
            read = ctx.inlined_loader(arg, through_views=True)

        def load(ops, index):
            value = read(ops, broadcast_index(arg, out_size, index))
            return value if dtype is None or dtype == arg.dtype else ops.to_dtype(value, dtype)

        return load
    if isinstance(arg, sympy.Expr):
        return lambda ops, index: ops.index_expr(arg, dtype or torch.int64)
    if isinstance(arg, (bool, int, float)):
        if dtype is None:
            dtype = (
                torch.bool
                if isinstance(arg, bool)
                else (torch.int64 if isinstance(arg, int) else torch.float32)
            )
        value = arg if not dtype.is_floating_point else float(arg)
        if dtype == torch.bool:
            value = bool(arg)
        elif not dtype.is_floating_point and dtype != torch.bool:
            value = int(arg)
        return lambda ops, index: ops.constant(value, dtype)
    raise NotImplementedError(f"cannot read {arg!r} ({type(arg).__name__}) in a pointwise op")


def _whole(ctx: LoweringContext, ref: TensorRef) -> bool:
    return ref.is_whole(ctx.buffer(ref.buffer))


def out_size(ctx: LoweringContext) -> tuple[sympy.Expr, ...]:
    from kiln_loopir.lowering.context import val_layout

    return val_layout(ctx.val)[0]


def make_pointwise(
    ctx: LoweringContext,
    fn: Callable,
    args: Sequence[object],
    *,
    in_dtype: torch.dtype | None = None,
) -> TensorRef:
    """A Pointwise node computing ``fn(ops, *values)`` from ``args`` broadcast together.

    Inputs are converted to ``in_dtype`` (default: the output's compute dtype); the result
    is converted to the output dtype.
    """
    size = out_size(ctx)
    out_dtype = ctx.val.dtype
    in_dtype = in_dtype or compute_dtype(out_dtype)
    loaders = [loader(a, size, in_dtype, ctx) for a in args]

    def inner_fn(ops, index):
        value = fn(ops, *[load(ops, index) for load in loaders])
        return value if in_dtype == out_dtype else ops.to_dtype(value, out_dtype)

    return ctx.pointwise(inner_fn)


def _simple(op_name: str) -> Callable:
    return lambda ops, *xs: getattr(ops, op_name)(*xs)


UNARY = {
    aten.abs: "abs", aten.neg: "neg", aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1",
    aten.log: "log", aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p",
    aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.sin: "sin", aten.cos: "cos", aten.tan: "tan",
    aten.asin: "asin", aten.acos: "acos", aten.atan: "atan", aten.sinh: "sinh",
    aten.cosh: "cosh", aten.tanh: "tanh", aten.asinh: "asinh", aten.acosh: "acosh",
    aten.atanh: "atanh", aten.erf: "erf", aten.erfc: "erfc", aten.erfinv: "erfinv",
    aten.sigmoid: "sigmoid", aten.reciprocal: "reciprocal", aten.floor: "floor",
    aten.ceil: "ceil", aten.trunc: "trunc", aten.sign: "sign", aten.lgamma: "lgamma",
    aten.digamma: "digamma", aten.bitwise_not: "bitwise_not", aten.i0: "i0",
    aten.special_i0e: "i0e", aten.special_i1: "i1", aten.special_i1e: "i1e",
    aten.special_erfcx: "erfcx", aten.special_ndtri: "ndtri",
}  # fmt: skip
BINARY = {
    aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.atan2: "atan2",
    aten.hypot: "hypot", aten.copysign: "copysign", aten.nextafter: "nextafter",
    aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or",
    aten.bitwise_xor: "bitwise_xor", aten.bitwise_left_shift: "bitwise_left_shift",
    aten.bitwise_right_shift: "bitwise_right_shift", aten.remainder: "remainder",
    aten.fmod: "fmod", aten.pow: "pow", aten.floor_divide: "floordiv", aten.special_zeta: "zeta",
}  # fmt: skip
COMPARISON = {
    aten.eq: "eq",
    aten.ne: "ne",
    aten.lt: "lt",
    aten.le: "le",
    aten.gt: "gt",
    aten.ge: "ge",
}
LOGICAL = {
    aten.logical_and: "logical_and", aten.logical_or: "logical_or",
    aten.logical_xor: "logical_xor",
}  # fmt: skip
PREDICATES = {aten.isnan: "isnan", aten.isinf: "isinf", aten.signbit: "signbit"}


def _register_table() -> None:
    for op, name in {**UNARY, **BINARY}.items():
        fn = _simple(name)
        register_lowering(op)(lambda ctx, *args, _fn=fn: make_pointwise(ctx, _fn, args))
    for op, name in COMPARISON.items():
        fn = _simple(name)
        register_lowering(op)(
            lambda ctx, a, b, _fn=fn: make_pointwise(
                ctx, _fn, (a, b), in_dtype=compute_dtype(promoted_dtype(a, b))
            )
        )
    for op, name in LOGICAL.items():
        fn = _simple(name)
        register_lowering(op)(
            lambda ctx, a, b, _fn=fn: make_pointwise(ctx, _fn, (a, b), in_dtype=torch.bool)
        )
    for op, name in PREDICATES.items():
        fn = _simple(name)
        register_lowering(op)(
            lambda ctx, a, _fn=fn: make_pointwise(ctx, _fn, (a,), in_dtype=a.dtype)
        )


_register_table()

# Exponents that ATen computes without pow (``x ** 3`` as ``x * x * x``, ``x ** 1`` as a
# copy): the values eager gives, at a fraction of a general pow's cost in a kernel (GPT-2's
# hand-written GELU spent most of its time in one, and the backward of ``x ** 2``,
# ``2 * x ** 1``, most of an RMSNorm backward's on the CPU).
POWERS_WITHOUT_POW = {
    1.0: lambda ops, v: v,
    0.5: lambda ops, v: ops.sqrt(v),
    2.0: lambda ops, v: ops.mul(v, v),
    3.0: lambda ops, v: ops.mul(ops.mul(v, v), v),
    -0.5: lambda ops, v: ops.rsqrt(v),
    -1.0: lambda ops, v: ops.reciprocal(v),
    -2.0: lambda ops, v: ops.reciprocal(ops.mul(v, v)),
}


@register_lowering(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(ctx, x, exponent):
    power = None
    if ctx.val.dtype.is_floating_point and type(exponent) in (int, float):
        power = POWERS_WITHOUT_POW.get(float(exponent))
    if power is None:
        return make_pointwise(ctx, _simple("pow"), (x, exponent))
    return make_pointwise(ctx, power, (x,))


@register_lowering(aten.round.default)
def round_(ctx, x):
    return make_pointwise(ctx, lambda ops, v: ops.round(v), (x,))


@register_lowering(aten.polygamma.default)
def polygamma(ctx, n, x):
    """The ``n``-th derivative of digamma, ``n`` a constant of the node, as ATen's CPU
    kernel takes it: digamma for 0, trigamma for 1, else ``(-1)^(n+1) n! zeta(n+1, x)``
    with ``n!`` rounded as ATen's ``exp(lgamma(n+1))`` in the compute dtype."""
    if not isinstance(n, int) or n < 0:  # a symbolic order: ATen's kernel decides
        return ctx.extern(ctx.op, (n, x), ctx.kwargs, ctx.val)
    if n <= 1:
        name = "trigamma" if n else "digamma"
        return make_pointwise(ctx, lambda ops, v: getattr(ops, name)(v), (x,))
    dt = compute_dtype(ctx.val.dtype)
    factorial = float(torch.tensor(float(n + 1), dtype=dt).lgamma().exp())
    factor = factorial if n % 2 else -factorial

    def fn(ops, v):
        return ops.mul(ops.constant(factor, dt), ops.zeta(ops.constant(float(n + 1), dt), v))

    return make_pointwise(ctx, fn, (x,))


@register_lowering(aten.logical_not)
def logical_not(ctx, x):
    return make_pointwise(ctx, lambda ops, v: ops.logical_not(v), (x,), in_dtype=torch.bool)


@register_lowering(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def add_sub(ctx, a, b, *, alpha=1):
    name = "add" if ctx.op.overloadpacket is aten.add else "sub"

    def fn(ops, x, y):
        if alpha != 1:
            y = ops.mul(y, ops.constant(alpha, compute_dtype(ctx.val.dtype)))
        return getattr(ops, name)(x, y)

    return make_pointwise(ctx, fn, (a, b))


@register_lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(ctx, a, b, *, alpha=1):
    def fn(ops, x, y):
        if alpha != 1:
            x = ops.mul(x, ops.constant(alpha, compute_dtype(ctx.val.dtype)))
        return ops.sub(y, x)

    return make_pointwise(ctx, fn, (a, b))


@register_lowering(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(ctx, a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return make_pointwise(ctx, lambda ops, x, y: ops.truediv(x, y), (a, b))
    name = {"trunc": "truncdiv", "floor": "floordiv"}[rounding_mode]
    return make_pointwise(ctx, lambda ops, x, y: getattr(ops, name)(x, y), (a, b))


@register_lowering(aten.true_divide)
def true_divide(ctx, a, b):
    return make_pointwise(ctx, lambda ops, x, y: ops.truediv(x, y), (a, b))


@register_lowering(
    aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar
)
def where(ctx, cond, a, b):
    size = out_size(ctx)
    dtype = compute_dtype(ctx.val.dtype)
    load_c, load_a, load_b = (
        loader(cond, size, torch.bool, ctx),
        loader(a, size, dtype, ctx),
        loader(b, size, dtype, ctx),
    )
    out = ctx.val.dtype

    def inner_fn(ops, index):
        v = ops.where(load_c(ops, index), load_a(ops, index), load_b(ops, index))
        return ops.to_dtype(v, out)

    return ctx.pointwise(inner_fn)


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, x, mask, value):
    return where(ctx, mask, value, x)


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx, x, min=None, max=None):  # noqa: A002 - aten's argument names
    args = [x] + [a for a in (min, max) if a is not None]

    def fn(ops, v, *bounds):
        it = iter(bounds)
        if min is not None:
            v = ops.maximum(v, next(it))
        if max is not None:
            v = ops.minimum(v, next(it))
        return v

    return make_pointwise(ctx, fn, args)


@register_lowering(aten.clamp_min)
def clamp_min(ctx, x, bound):
    return clamp(ctx, x, min=bound)


@register_lowering(aten.clamp_max)
def clamp_max(ctx, x, bound):
    return clamp(ctx, x, max=bound)


@register_lowering(aten._to_copy.default)
def to_copy(ctx, x, *, dtype=None, device=None, layout=None, memory_format=None, **_):
    if device is not None and torch.device(device) != x.device:
        return ctx.extern(ctx.op, (x,), ctx.kwargs, ctx.val)
    return make_pointwise(ctx, lambda ops, v: v, (x,), in_dtype=ctx.val.dtype)


@register_lowering(aten.clone.default, aten.lift_fresh_copy.default)
def clone(ctx, x, *, memory_format=None):
    return make_pointwise(ctx, lambda ops, v: v, (x,), in_dtype=x.dtype)


@register_lowering(aten.copy.default)
def copy(ctx, dst, src, non_blocking=False):
    return make_pointwise(ctx, lambda ops, v: v, (src,), in_dtype=ctx.val.dtype)


@register_lowering(aten.relu.default)
def relu(ctx, x):
    return make_pointwise(
        ctx, lambda ops, v: ops.maximum(v, ops.constant(0, compute_dtype(x.dtype))), (x,)
    )


@register_lowering(aten.gelu.default)
def gelu(ctx, x, *, approximate="none"):
    dt = compute_dtype(x.dtype)

    def c(ops, v):
        return ops.constant(v, dt)

    def exact(ops, v):
        inner = ops.erf(ops.mul(v, c(ops, math.sqrt(0.5))))
        return ops.mul(ops.mul(v, c(ops, 0.5)), ops.add(inner, c(ops, 1.0)))

    def tanh(ops, v):
        cube = ops.mul(ops.mul(v, v), v)
        inner = ops.mul(c(ops, math.sqrt(2 / math.pi)), ops.add(v, ops.mul(cube, c(ops, 0.044715))))
        return ops.mul(ops.mul(v, c(ops, 0.5)), ops.add(ops.tanh(inner), c(ops, 1.0)))

    return make_pointwise(ctx, tanh if approximate == "tanh" else exact, (x,))


@register_lowering(aten.silu.default)
def silu(ctx, x):
    return make_pointwise(ctx, lambda ops, v: ops.mul(v, ops.sigmoid(v)), (x,))


@register_lowering(aten.leaky_relu.default)
def leaky_relu(ctx, x, negative_slope=0.01):
    dt = compute_dtype(x.dtype)

    def fn(ops, v):
        neg = ops.mul(v, ops.constant(negative_slope, dt))
        return ops.where(ops.gt(v, ops.constant(0, dt)), v, neg)

    return make_pointwise(ctx, fn, (x,))


@register_lowering(aten.hardtanh.default)
def hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return clamp(ctx, x, min=min_val, max=max_val)


@register_lowering(aten.hardsigmoid.default)
def hardsigmoid(ctx, x):
    dt = compute_dtype(x.dtype)

    def fn(ops, v):
        v = ops.add(ops.truediv(v, ops.constant(6.0, dt)), ops.constant(0.5, dt))
        return ops.minimum(ops.maximum(v, ops.constant(0.0, dt)), ops.constant(1.0, dt))

    return make_pointwise(ctx, fn, (x,))


@register_lowering(aten.hardswish.default)
def hardswish(ctx, x):
    dt = compute_dtype(x.dtype)

    def fn(ops, v):
        t = ops.minimum(
            ops.maximum(ops.add(v, ops.constant(3.0, dt)), ops.constant(0.0, dt)),
            ops.constant(6.0, dt),
        )
        return ops.truediv(ops.mul(v, t), ops.constant(6.0, dt))

    return make_pointwise(ctx, fn, (x,))


@register_lowering(aten.elu.default)
def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    dt = compute_dtype(x.dtype)

    def fn(ops, v):
        neg = ops.mul(ops.expm1(ops.mul(v, ops.constant(input_scale, dt))), ops.constant(alpha, dt))
        out = ops.where(ops.gt(v, ops.constant(0.0, dt)), v, neg)
        return ops.mul(out, ops.constant(scale, dt))

    return make_pointwise(ctx, fn, (x,))


@register_lowering(aten.softplus.default)
def softplus(ctx, x, beta=1.0, threshold=20.0):
    dt = compute_dtype(x.dtype)

    def fn(ops, v):
        bx = ops.mul(v, ops.constant(beta, dt))
        soft = ops.truediv(ops.log1p(ops.exp(bx)), ops.constant(beta, dt))
        return ops.where(ops.gt(bx, ops.constant(threshold, dt)), v, soft)

    return make_pointwise(ctx, fn, (x,))


@register_lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(ctx, start, end, weight):
    def fn(ops, s, e, w):
        return ops.add(s, ops.mul(w, ops.sub(e, s)))

    return make_pointwise(ctx, fn, (start, end, weight))


@register_lowering(aten.addcmul.default)
def addcmul(ctx, x, t1, t2, *, value=1):
    dt = compute_dtype(ctx.val.dtype)
    return make_pointwise(
        ctx,
        lambda ops, a, b, c: ops.add(a, ops.mul(ops.constant(value, dt), ops.mul(b, c))),
        (x, t1, t2),
    )


@register_lowering(aten.addcdiv.default)
def addcdiv(ctx, x, t1, t2, *, value=1):
    dt = compute_dtype(ctx.val.dtype)
    return make_pointwise(
        ctx,
        lambda ops, a, b, c: ops.add(a, ops.mul(ops.constant(value, dt), ops.truediv(b, c))),
        (x, t1, t2),
    )


# -- constants ---------------------------------------------------------------------------
def _fill(ctx, value):
    dtype = ctx.val.dtype
    return ctx.pointwise(lambda ops, index: loader(value, (), dtype)(ops, index))


@register_lowering(aten.full.default)
def full(ctx, size, fill_value, **_):
    return _fill(ctx, fill_value)


@register_lowering(aten.full_like.default)
def full_like(ctx, x, fill_value, **_):
    return _fill(ctx, fill_value)


@register_lowering(aten.scalar_tensor.default)
def scalar_tensor(ctx, value, **_):
    return _fill(ctx, value)


@register_lowering(aten.zeros.default, aten.zeros_like.default)
def zeros(ctx, *_, **__):
    return _fill(ctx, 0)


@register_lowering(aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default)
def empty(ctx, *_, **__):
    # any values do: zeros, so that a kernel never reads memory nobody wrote
    return _fill(ctx, 0)


@register_lowering(aten.ones.default, aten.ones_like.default)
def ones(ctx, *_, **__):
    return _fill(ctx, 1)


@register_lowering(aten.fill.Scalar)
def fill(ctx, x, value):
    return _fill(ctx, value)


@register_lowering(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx, *args, **_):
    nums = [a for a in args if not isinstance(a, (torch.dtype, torch.device))]
    start, step = (0, 1)
    if len(nums) >= 2:
        start = nums[0]
    if len(nums) >= 3:
        step = nums[2]
    dtype = ctx.val.dtype
    if dtype.is_floating_point or isinstance(start, float) or isinstance(step, float):

        def inner_fn(ops, index):
            i = ops.index_expr(index[0], torch.float64)
            v = ops.add(
                ops.constant(float(start), torch.float64),
                ops.mul(i, ops.constant(float(step), torch.float64)),
            )
            return ops.to_dtype(v, dtype)
    else:

        def inner_fn(ops, index):
            return ops.index_expr(sympy.sympify(start) + sympy.sympify(step) * index[0], dtype)

    return ctx.pointwise(inner_fn)
