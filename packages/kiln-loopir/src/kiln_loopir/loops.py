"""Adjacent reduction loops that every access walks as one run become one loop.

A batch norm over ``[N, C, H, W]`` in training reduces each channel over N, H and W: a
kernel with reduction ranges ``[8, 28, 28]`` whose innermost loop is 28 points long. A
backend that vectorises the innermost loop in blocks of 16 or 32 lanes finds no block in
28 points and reduces every point in scalar code. Yet every access of that kernel reads H
and W together, as ``28*h + w`` times one stride: the two loops are one loop of 784 points.

:func:`merge_reduction_loops` finds such pairs (every load and store index is affine in
both variables, the outer one's coefficient the inner one's size times the inner one's; no
other use of either variable) and rewrites the kernel over the merged space: each node's
ranges get ``(1, a*b)`` where they had ``(a, b)``, so its inner function, unchanged, is
called with 0 for the outer variable and the merged one for the inner, which gives every
index its old value. Kernels with scans, scatters, ``argmax``/``argmin`` or symbolic sizes
in the pair are left as they are.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from kiln_loopir.ir import Pointwise, Reduction
from kiln_loopir.kernel import Kernel
from kiln_loopir.ops import TraceHandler
from kiln_loopir.symbols import reduction_vars

POSITIONAL = frozenset({"argmax", "argmin"})  # results that name a point of the loops


def merge_reduction_loops(kernel: Kernel) -> Kernel:
    """``kernel`` with each mergeable pair of adjacent reduction loops made one (the same
    object, changed in place, or untouched)."""
    j = len(kernel.reduction_ranges) - 2
    while j >= 0:
        if _mergeable(kernel, j):
            _merge(kernel, j)
        j -= 1
    return kernel


def _mergeable(kernel: Kernel, j: int) -> bool:
    a, b = kernel.reduction_ranges[j], kernel.reduction_ranges[j + 1]
    if not (_integer(a) and _integer(b)):
        return False
    first = len(kernel.ranges) + j
    for node in kernel.nodes:
        if isinstance(node.body, Reduction):
            if node.body.reduction_type in POSITIONAL:
                return False
        elif not isinstance(node.body, Pointwise):
            return False  # scans walk their loop in order; scatters index by value
        elif node.name in kernel.orders:  # a node over reordered loops: the pair in order
            order = kernel.orders[node.name]
            d = order.index(first)
            if d + 1 >= len(order) or order[d + 1] != first + 1:
                return False
    outer, inner = reduction_vars(len(kernel.reduction_ranges))[j : j + 2]
    accesses = _Accesses()
    stores = kernel.body(accesses)
    if any({outer, inner} & sympy.sympify(e).free_symbols for e in accesses.values):
        return False  # a loop variable used as a value (an iota, a mask)
    indices = [load.index for load in accesses.loads] + list(stores.values())
    return all(_one_run(sympy.expand(e), outer, inner, b) for e in indices)


def _one_run(index: sympy.Expr, outer: sympy.Symbol, inner: sympy.Symbol, b) -> bool:
    """Whether ``index`` reads ``outer`` and ``inner`` only as ``b*outer + inner`` (times
    one coefficient), or not at all."""
    if not {outer, inner} & index.free_symbols:
        return True
    c_outer, c_inner = index.coeff(outer, 1), index.coeff(inner, 1)
    rest = sympy.expand(index - c_outer * outer - c_inner * inner)
    if {outer, inner} & (rest.free_symbols | c_outer.free_symbols | c_inner.free_symbols):
        return False  # not affine in them (a product, a floor division, a modulo)
    return sympy.expand(c_outer - b * c_inner) == 0


def _merge(kernel: Kernel, j: int) -> None:
    """Rewrite ``kernel`` over reduction loops ``j`` and ``j + 1`` made one."""
    a, b = kernel.reduction_ranges[j], kernel.reduction_ranges[j + 1]
    first = len(kernel.ranges) + j  # the pair's first dimension in the whole space
    levels = kernel.levels()
    orders = {}
    for node, level in zip(kernel.nodes, levels, strict=True):
        if level == "reduction":
            body = node.body
            node.body = replace(
                body, reduction_ranges=_merged_ranges(body.reduction_ranges, j, a, b)
            )
        elif level == "inner":
            order = kernel.orders.get(node.name) or tuple(range(_dims_of(kernel)))
            d = order.index(first)  # the node's loop over the pair's first dimension
            node.body = replace(node.body, ranges=_merged_ranges(node.body.ranges, d, a, b))
            if node.name in kernel.orders:
                orders[node.name] = tuple(k if k <= first else k - 1 for k in order if k != first)
    kernel.reduction_ranges = [
        *kernel.reduction_ranges[:j],
        a * b,
        *kernel.reduction_ranges[j + 2 :],
    ]
    kernel.orders = orders


def merged_from(ranges, size) -> bool:
    """Whether ``ranges`` are ``size`` with runs of adjacent dimensions merged by
    :func:`merge_reduction_loops`: each run ``(a, b, ..)`` made ``(1, .., a*b*..)``."""
    if len(ranges) != len(size):
        return False
    pending = 1  # the product of the run not closed yet
    for r, s in zip(ranges, size, strict=True):
        pending *= s
        if r == pending:
            pending = 1
        elif r != 1:
            return False
    return pending == 1


def _dims_of(kernel: Kernel) -> int:
    return len(kernel.ranges) + len(kernel.reduction_ranges)


def _merged_ranges(ranges, d: int, a, b) -> tuple:
    """``ranges`` (ones included) with its ``d``-th and next dimensions other than ones,
    ``(a, b)``, made ``(1, a*b)``."""
    positions = [i for i, r in enumerate(ranges) if r != 1]
    p, q = positions[d], positions[d + 1]
    assert (ranges[p], ranges[q]) == (a, b), (ranges, d, a, b)
    merged = list(ranges)
    merged[p], merged[q] = 1, a * b
    return tuple(merged)


def _integer(x) -> bool:
    return isinstance(x, int) or (isinstance(x, sympy.Basic) and x.is_Integer)


class _Accesses(TraceHandler):
    """A trace that keeps every index expression used as a value."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[sympy.Expr] = []

    def index_expr(self, expr, dtype):
        self.values.append(expr)
        return super().index_expr(expr, dtype)
