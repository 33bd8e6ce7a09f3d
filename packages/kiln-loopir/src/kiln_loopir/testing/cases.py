"""The op table: functions over the ops kiln-loopir lowers, with fresh random inputs in
each dtype they take.

Every code generator runs it against eager: kiln-loopir with its reference codegen,
kiln-cpp in float32, bfloat16 and int64, as given and with non-contiguous inputs. The
sizes are odd on purpose, and several cases broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["Case", "CASES", "FLOAT", "ALL", "r", "SizeFamily", "SIZE_FAMILIES"]

FLOAT = (torch.float32, torch.bfloat16)
ALL = (torch.float32, torch.bfloat16, torch.int64)


def r(*size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fresh random values of ``dtype``: normal floats, integers in [-20, 20), random bools."""
    if dtype.is_floating_point:
        return torch.randn(size).to(dtype)
    if dtype == torch.bool:
        return torch.rand(*size) > 0.5
    return torch.randint(-20, 20, size, dtype=dtype)


def idx(high: int, *size: int, low: int = 0) -> torch.Tensor:
    return torch.randint(low, high, size)


@dataclass(frozen=True)
class Case:
    """``fn`` and ``inputs(dtype)`` making its inputs; ``dtypes`` are those it takes (the
    first is the one a single-dtype run uses)."""

    fn: Callable
    inputs: Callable[[torch.dtype], list]
    dtypes: tuple[torch.dtype, ...] = FLOAT


def _activations(x):
    return (
        F.gelu(x) + F.silu(x) + F.relu(x) + F.gelu(x, approximate="tanh") + F.leaky_relu(x)
        + F.elu(x) + F.hardswish(x) + F.softplus(x) + F.hardsigmoid(x)
    )  # fmt: skip


def _special(x):
    special = torch.special
    return (
        torch.i0(x), special.i0e(x * 9), special.i1(x), special.i1e(x * 9),
        special.erfcx(x * 4), special.ndtri(torch.sigmoid(x * 3)), special.log_ndtr(x * 5),
    )  # fmt: skip


def _polygamma(x):
    special = torch.special
    return (
        torch.polygamma(0, x * 3), torch.polygamma(1, x * 3), torch.polygamma(2, x * 3),
        special.polygamma(3, x.abs() * 20), torch.polygamma(6, x * 3),
        special.zeta(x.abs() * 3 + 1.5, x.abs() * 4),
    )  # fmt: skip


CASES: dict[str, Case] = {
    # polygamma of orders 0 (digamma), 1 (trigamma) and past (Hurwitz zeta), for negative
    # x (reflection, and zeta's direct sum) and past the shift (the asymptotic series)
    "polygamma": Case(_polygamma, lambda d: [r(5, 7, dtype=d)], (torch.float32, torch.float64)),
    # Bessel functions on both sides of 8 (their two expansions), erfcx and ndtri (which
    # eager has in no half-precision type)
    "special_functions": Case(
        _special, lambda d: [r(5, 7, dtype=d)], (torch.float32, torch.float64)
    ),
    "pointwise_chain": Case(
        lambda x: (x.sin() + 1).relu() * 2 - x.exp(), lambda d: [r(4, 9, dtype=d)], ALL
    ),
    "broadcast_binary": Case(
        lambda x, y: x * y + y, lambda d: [r(3, 1, 5, dtype=d), r(4, 1, dtype=d)], ALL
    ),
    "scalar_ops": Case(lambda x: (x + 2.5) / 3 - 1**x, lambda d: [r(7, 3, dtype=d)], ALL),
    "comparison_where": Case(
        lambda x, y: torch.where(x > y, x, y * 2), lambda d: [r(5, 6, dtype=d), r(6, dtype=d)], ALL
    ),
    "logical": Case(
        lambda a, b: (a & b) | ~a ^ (a != b),
        lambda d: [r(9, dtype=d), r(9, dtype=d)],
        (torch.bool, torch.int64),
    ),
    "clamp": Case(lambda x: x.clamp(-0.5, 0.7) + x.clamp(min=0.1), lambda d: [r(10, dtype=d)]),
    "casts": Case(
        lambda x: x.to(torch.float16).to(torch.float32) + x.to(torch.int32),
        lambda d: [r(6, 5, dtype=d)],
        ALL,
    ),
    "int_math": Case(
        lambda a, b: a * 3 + b // 2 - a % 5,
        lambda d: [r(8, dtype=d), r(8, dtype=d)],
        (torch.int64, torch.int32),
    ),
    "int_div_to_float": Case(
        lambda a: a / 3, lambda d: [r(11, dtype=d)], (torch.int32, torch.int64)
    ),
    "half": Case(
        lambda x: (x * x).sum(-1) + x.mean(-1),
        lambda d: [r(4, 33, dtype=d)],
        (torch.float16, torch.bfloat16, torch.float32),
    ),
    "activations": Case(_activations, lambda d: [r(3, 17, dtype=d)]),
    "sum_dims": Case(
        lambda x: (x.sum(), x.sum(0), x.sum((0, 2), keepdim=True)),
        lambda d: [r(3, 4, 5, dtype=d)],
        ALL,
    ),
    "prod_mean": Case(
        lambda x: (x.prod(1), x.mean(), x.mean(-1, keepdim=True)), lambda d: [r(3, 5, dtype=d)]
    ),
    "max_min": Case(
        lambda x: (x.amax(1), x.amin(0), x.max(), x.min(1)), lambda d: [r(4, 6, dtype=d)], ALL
    ),
    "argmax": Case(
        lambda x: (x.argmax(1), x.argmin(0), x.argmax()), lambda d: [r(5, 7, dtype=d)], ALL
    ),
    "any_all": Case(
        lambda x: (x.any(1), x.all(), (x > 0).any()),
        lambda d: [r(5, 3, dtype=d)],
        (torch.bool, torch.int64, torch.float32),
    ),
    "var_mean": Case(lambda x: torch.var_mean(x, 1), lambda d: [r(6, 13, dtype=d)]),
    "var_std": Case(
        lambda x: (x.var(0, correction=0), x.std(), x.var(1, keepdim=True)),
        lambda d: [r(5, 9, dtype=d)],
    ),
    "softmax": Case(lambda x: torch.softmax(x, -1), lambda d: [r(4, 10, dtype=d)]),
    "softmax_dim0": Case(lambda x: torch.softmax(x, 0), lambda d: [r(4, 10, dtype=d)]),
    "log_softmax": Case(lambda x: torch.log_softmax(x, 1), lambda d: [r(3, 7, 2, dtype=d)]),
    "logsumexp": Case(lambda x: torch.logsumexp(x, 1), lambda d: [r(3, 7, dtype=d)]),
    "layer_norm_gelu": Case(
        lambda x, w, b: F.gelu(F.layer_norm(x, (8,), w, b)),
        lambda d: [r(5, 8, dtype=d), r(8, dtype=d), r(8, dtype=d)],
    ),
    "group_norm": Case(
        lambda x, w, b: F.group_norm(x, 2, w, b),
        lambda d: [r(2, 4, 3, 3, dtype=d), r(4, dtype=d), r(4, dtype=d)],
    ),
    "batch_norm_eval": Case(
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
        lambda d: [
            r(3, 4, 5, dtype=d),
            r(4, dtype=d),
            (r(4).abs() + 0.5).to(d),
            r(4, dtype=d),
            r(4, dtype=d),
        ],
    ),
    "views": Case(
        lambda x: x.view(8, 4).permute(1, 0)[1:3].reshape(-1).unsqueeze(0).expand(3, 16) + 1,
        lambda d: [r(4, 8, dtype=d)],
        ALL,
    ),
    "transpose_add": Case(
        lambda x, y: x.t() + y, lambda d: [r(5, 7, dtype=d), r(7, 5, dtype=d)], ALL
    ),
    "select_squeeze": Case(
        lambda x: x[:, 2].unsqueeze(-1).squeeze(1) * x[1], lambda d: [r(4, 4, dtype=d)], ALL
    ),
    "as_strided": Case(
        lambda x: torch.as_strided(x, (3, 3), (1, 3), 1) * 2, lambda d: [r(20, dtype=d)], ALL
    ),
    "cat": Case(
        lambda x, y: torch.cat([x + 1, y * 2, x], 1),
        lambda d: [r(3, 4, dtype=d), r(3, 2, dtype=d)],
        ALL,
    ),
    "stack": Case(
        lambda x, y: torch.stack([x, y], 1).sum(0),
        lambda d: [r(3, 4, dtype=d), r(3, 4, dtype=d)],
        ALL,
    ),
    "pad": Case(lambda x: F.pad(x, (1, 2, 0, 1), value=3.0), lambda d: [r(3, 4, dtype=d)], ALL),
    "gather": Case(
        lambda x, i: torch.gather(x, 1, i), lambda d: [r(4, 8, dtype=d), idx(8, 4, 3)], ALL
    ),
    "embedding": Case(
        lambda w, i: F.embedding(i, w), lambda d: [r(10, 3, dtype=d), idx(10, 2, 5)], ALL
    ),
    "index": Case(
        lambda x, i: x[i] + x[:, i].sum(), lambda d: [r(6, 6, dtype=d), idx(6, 4, low=-6)], ALL
    ),
    "index_two": Case(
        lambda x, i, j: x[i, :, j], lambda d: [r(5, 3, 7, dtype=d), idx(5, 4, 1), idx(7, 2)], ALL
    ),
    "index_select": Case(
        lambda x, i: x.index_select(1, i),
        lambda d: [r(3, 5, dtype=d), torch.tensor([4, 0, 0, 2])],
        ALL,
    ),
    "scatter_add": Case(
        lambda x, i, s: x.scatter_add(0, i, s),
        lambda d: [r(5, 3, dtype=d), idx(5, 4, 3), r(4, 3, dtype=d)],
        ALL,
    ),
    "index_put": Case(
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        lambda d: [r(6, 2, dtype=d), torch.tensor([0, 2, 2, 5]), r(4, 2, dtype=d)],
        ALL,
    ),
    "slice_scatter": Case(
        lambda x, s: torch.slice_scatter(x, s, 1, 1, 7, 2),
        lambda d: [r(3, 8, dtype=d), r(3, 3, dtype=d)],
        ALL,
    ),
    "full_arange": Case(
        lambda x: x + torch.arange(5) + torch.full((5,), 2.0), lambda d: [r(5, dtype=d)], ALL
    ),
    "matmul_bias_gelu": Case(
        lambda x, w, b: F.gelu(x @ w + b),
        lambda d: [r(4, 6, dtype=d), r(6, 3, dtype=d), r(3, dtype=d)],
    ),
    "bmm_softmax": Case(
        lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 2, -1),
        lambda d: [r(2, 3, 4, dtype=d), r(2, 5, 4, dtype=d)],
    ),
    "conv_relu": Case(
        lambda x, w: F.relu(F.conv2d(x, w, padding=1)),
        lambda d: [r(1, 2, 5, 5, dtype=d), r(3, 2, 3, 3, dtype=d)],
    ),
    "cumsum_fallback": Case(lambda x: x.cumsum(0) * 2, lambda d: [r(6, 2, dtype=d)], ALL),
    "odd_sizes": Case(lambda x: torch.softmax(x * 3, -1).sum(0), lambda d: [r(1, 1, 13, dtype=d)]),
    "zero_dim": Case(lambda x, y: x * y + x.sum(), lambda d: [r(dtype=d), r(3, dtype=d)], ALL),
    "empty": Case(lambda x: (x + 1, x.sum(0)), lambda d: [r(0, 4, dtype=d)], ALL),
}


@dataclass(frozen=True)
class SizeFamily:
    """``fn`` and ``inputs(n)`` making its inputs at size ``n``; ``sizes`` are the sizes
    of one family: compiled once (symbolic), checked at each (odd ones among them)."""

    fn: Callable
    inputs: Callable[[int], list]
    sizes: tuple[int, ...] = (4, 2, 3, 7, 16, 33)


# Functions whose graph, compiled once with symbolic sizes, runs at every size of the family
SIZE_FAMILIES: dict[str, SizeFamily] = {
    "pointwise_batch": SizeFamily(lambda x: (x.sin() * 2 + 1).relu(), lambda n: [r(n, 32)]),
    "softmax_row_length": SizeFamily(
        lambda x: torch.softmax(x * 3, -1) + x.amax(-1, keepdim=True), lambda n: [r(5, n)]
    ),
    "sum_both_dims": SizeFamily(lambda x: x.sum(0).sum() + x.mean(1), lambda n: [r(n, n + 3)]),
    "broadcast_row": SizeFamily(lambda x, b: x * b + b, lambda n: [r(n, 8), r(8)]),
    "mlp_batch": SizeFamily(
        lambda x, w1, b1, w2: torch.softmax(F.relu(x @ w1 + b1) @ w2, -1),
        lambda n: [r(n, 16), r(16, 24), r(24), r(24, 10)],
    ),
    "view_of_an_expression": SizeFamily(
        lambda x: x.view(x.shape[0] * 2, -1).softmax(-1).reshape(-1, 4).sum(1),
        lambda n: [r(n, 16)],
    ),
    "transpose_flatten": SizeFamily(lambda x: x.t().flatten().cos(), lambda n: [r(n, 6)]),
    "cat_slice": SizeFamily(
        lambda x: torch.cat([x[1:], x[:1] * 2], 0).exp(), lambda n: [r(n, 5)], (4, 3, 6, 9)
    ),
    # sizes past polynomials: torch's symbolic shapes make float and rounding functions
    "scaled_by_a_size_power": SizeFamily(  # an attention scale: FloatPow(ToFloat(s1), -0.5)
        lambda x: (x * x.shape[-1] ** -0.5).softmax(-1), lambda n: [r(3, n)]
    ),
    "square_root_of_a_size": SizeFamily(  # what math.sqrt(n) captures as: OpaqueUnaryFn_sqrt
        lambda x: x / torch._sym_sqrt(x.shape[-1]) + x.shape[0] / x.shape[1],
        lambda n: [r(n, n + 2)],
    ),
    "rounded_slice_lengths": SizeFamily(  # CeilToInt(IntTrueDiv(s1, 3)), RoundToInt, TruncToInt
        lambda x: (
            x[:, : math.ceil(x.shape[1] / 3)].sum(1)
            + x[:, : round(x.shape[1] * 0.7)].amax(1)
            + x[:, : torch.sym_int(x.shape[1] * 0.5 + 1)].mean(1)
        ),
        lambda n: [r(3, n)],
    ),
    "power_of_sizes": SizeFamily(  # PowByNatural(s0, s1) and the Max of float sizes
        lambda x: x * x.shape[0] ** x.shape[1] + torch.sym_max(x.shape[1] / 2, 3.0),
        lambda n: [r(2, n)],
    ),
}
