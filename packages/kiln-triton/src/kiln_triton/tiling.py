"""How a kernel's iteration space maps onto Triton blocks.

Two steps, both decided from every index the kernel reads or writes:

- ``merge_dims``: adjacent dimensions that every index walks as one (coefficient of the
  outer one = coefficient of the inner one times its size) merge into one, so a
  contiguous 4-D elementwise kernel indexes with ``xindex`` itself, without div/mod.
- ``choose_tiling``: a kernel without reduction ranges runs on 1-D blocks of ``xindex``
  unless some access is contiguous along another dimension than the last (a transpose):
  then it runs on 2-D ``[YBLOCK, XBLOCK]`` tiles, the dimensions up to that one on ``y``
  and the rest on ``x``, so both the access contiguous in ``y`` and the ones contiguous in
  ``x`` are coalesced. A kernel with reduction ranges runs on ``[XBLOCK, RBLOCK]`` tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy


def _linear_coeff(expr: sympy.Expr, var: sympy.Symbol) -> sympy.Expr | None:
    """The coefficient of ``var`` in ``expr`` if ``expr`` is linear in it, else None."""
    if not expr.has(var):
        return sympy.S.Zero
    c = expr.coeff(var)
    if (
        c == 0
        or (expr - c * var).expand().has(var)
        or any(s.name[:1] in ("x", "r") and s.name[1:].isdigit() for s in c.free_symbols)
    ):
        return None
    return c


def merge_dims(ranges, variables, exprs) -> tuple[list, list, dict]:
    """Merge runs of adjacent dimensions; returns (new ranges, new variables, substitution
    of the old variables)."""
    n = len(ranges)
    if n <= 1:
        return list(ranges), list(variables), {}

    def mergeable(i: int) -> bool:
        for e in exprs:
            ci = _linear_coeff(e, variables[i])
            cj = _linear_coeff(e, variables[i + 1])
            if ci is None or cj is None or sympy.expand(ci - cj * ranges[i + 1]) != 0:
                return False
        return True

    blocks: list[list[int]] = [[0]]
    for i in range(n - 1):
        if mergeable(i):
            blocks[-1].append(i + 1)
        else:
            blocks.append([i + 1])
    if len(blocks) == n:
        return list(ranges), list(variables), {}
    prefix = variables[0].name[0]
    new_vars = [
        sympy.Symbol(f"{prefix}{b}", integer=True, nonnegative=True) for b in range(len(blocks))
    ]
    new_ranges, subs = [], {}
    for b, dims in enumerate(blocks):
        new_ranges.append(sympy.expand(math.prod(ranges[d] for d in dims)))
        for d in dims[:-1]:
            subs[variables[d]] = sympy.S.Zero
        subs[variables[dims[-1]]] = new_vars[b]
    return new_ranges, new_vars, subs


@dataclass
class Tiling:
    """``kind`` is ``pointwise`` (1-D blocks), ``tiled`` (2-D, ``split`` = how many leading
    dimensions go on ``y``) or ``reduction``."""

    kind: str
    ranges: list
    reduction_ranges: list
    split: int = 0


def _contiguous_dim(expr: sympy.Expr, variables) -> int | None:
    for d, v in enumerate(variables):
        if _linear_coeff(expr, v) == 1:
            return d
    return None


def choose_tiling(ranges, reduction_ranges, variables, accesses) -> Tiling:
    if reduction_ranges:
        return Tiling("reduction", ranges, reduction_ranges)
    last = len(ranges) - 1
    if last >= 1:
        for expr in accesses:
            d = _contiguous_dim(expr, variables)
            if d is not None and d != last and _linear_coeff(expr, variables[last]) != 0:
                return Tiling("tiled", ranges, [], split=d + 1)
    return Tiling("pointwise", ranges, [])


def column_major(reduction_vars, outer_vars, loads) -> bool:
    """Whether the kernel's loads run along the outer dimensions rather than the reduction
    (a reduction over a non-contiguous dimension, like ``x.sum(0)``)."""
    along_r = along_x = 0
    for expr in loads:
        if reduction_vars and _linear_coeff(expr, reduction_vars[-1]) == 1:
            along_r += 1
        elif outer_vars and _linear_coeff(expr, outer_vars[-1]) == 1:
            along_x += 1
    return along_x > along_r
