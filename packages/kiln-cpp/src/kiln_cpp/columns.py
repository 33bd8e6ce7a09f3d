"""Column reductions: a reduction along a strided dimension whose last outer dimension is
contiguous (``x.sum(0)``) runs its vector lanes over outer points instead of reduction
points.

The last outer loop runs in blocks of :func:`column_lanes` points; each point of a block
keeps its accumulators in an array (one lane each), the reduction loops run outside and an
``omp simd`` loop over the block's points inside them, so each step reads a contiguous
piece of one row. A long float sum keeps its lanes in a ``kiln::CascadeLanes`` (each row a
block of the cascade), as eager adds a column: in float, its error growing with the log of
the rows. :mod:`kiln_cpp.split` runs the same blocks in chunks of rows across threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from kiln_cpp.printer import cexpr
from kiln_cpp.vectorize import ACCUMULATOR, coefficient, simd_safe
from kiln_loopir.symbols import index_vars, reduction_vars

# outer points per block of a column reduction: 16 (two AVX2 vectors of floats), or 64
# where the dimension has that many. A block walks all the rows, reading its points of
# each: 64 bytes a row at a 4 KB stride with 16 points made a 1024 x 1024 column sum 0.54x
# eager's speed on one thread, 256 bytes made it 1.06x (0.8x -> 1.5x in bfloat16).
COLUMN_LANES = 16
WIDE_COLUMN_LANES = 64


def column_lanes(size: str) -> int:
    """The outer points per block of a column reduction whose last outer dimension has
    ``size`` points (a C expression: a symbolic size takes the narrow blocks)."""
    wide = size.isdigit() and int(size) >= WIDE_COLUMN_LANES
    return WIDE_COLUMN_LANES if wide else COLUMN_LANES


def column_block(x: str, size: str) -> tuple[int, str]:
    """``(points per block, where the block starting at {x}_block ends)`` for a column
    reduction over ``size`` points of ``x``: a fixed trip count where the blocks are whole,
    with no tail for the compiler to mask."""
    lanes = column_lanes(size)
    if size.isdigit() and int(size) % lanes == 0:
        return lanes, f"{x}_block + {lanes}"
    return lanes, f"std::min<int64_t>({x}_block + {lanes}, {size})"


def column_reduction(kernel, items: list) -> bool:
    """Whether the kernel reduces along a strided dimension while its last outer dimension
    is contiguous (``x.sum(0)``): then the lanes run over outer points instead (see
    :func:`column_reduction_lines`). Only for one reduction loop, first in the body, of
    clause-free accumulators (each lane keeps its own), with no indirect index."""
    from kiln_cpp.handler import ReductionLoop  # the handler imports vectorize

    if not kernel.ranges or not kernel.reduction_ranges or not items:
        return False
    loop, rest = items[0], items[1:]
    if not isinstance(loop, ReductionLoop) or any(not isinstance(i, str) for i in rest):
        return False
    if any(a.kind not in ("sum", "dot", "prod", "max", "min") for a in loop.reductions):
        return False
    if not all(ACCUMULATOR.match(line) for line in loop.prologue):
        return False
    if any("kiln_oob" in line or "_spill" in line for line in loop.body + rest):
        return False
    x_last = index_vars(len(kernel.ranges))[-1]
    r_last = reduction_vars(len(kernel.reduction_ranges))[-1]
    loads = kernel.trace().loads
    strided = any(coefficient(ld.index, r_last) != 1 for ld in loads if ld.index.has(r_last))
    contiguous = any(coefficient(ld.index, x_last) == 1 for ld in loads)
    return strided and contiguous


@dataclass
class ColumnLanes:
    """The lines that keep a column reduction's accumulators per point of a block of
    ``lanes`` points of ``x`` (its lane: ``x - x_block``)."""

    declare: list[str]  # before the reduction loops
    reset: list[str]  # in a loop over the block's points, before the reduction loops
    bind: list[str]  # in the simd loop: each accumulator as its lane's
    next_row: list[str]  # after the simd loop, each step of the reduction loops
    read: dict[str, str]  # accumulator -> its lane's value, after the reduction loops
    types: dict[str, str]  # accumulator -> its C++ type (the prologue's)


def column_accumulators(loop, lanes: int, x: str, rows: str) -> ColumnLanes:
    """The lanes of ``loop``'s accumulators (a :class:`~kiln_cpp.handler.ReductionLoop`
    whose prologue declares them all): an array of ``lanes`` values each, or, for a long
    float sum, a cascade whose blocks are the ``rows`` (C++) steps of the reduction
    loops."""
    cascades = {a.acc: a.lane_type for a in loop.reductions if a.cascade}
    lane = f"{x} - {x}_block"
    out = ColumnLanes([], [], [], [], {}, {})
    for m in (ACCUMULATOR.match(line) for line in loop.prologue):
        acc, acc_type = m["acc"], m["type"]
        out.types[acc] = acc_type
        if acc in cascades:
            out.declare.append(f"kiln::CascadeLanes<{lanes}, {cascades[acc]}> {acc}_lanes({rows});")
            out.bind.append(f"{cascades[acc]}& {acc} = {acc}_lanes.level[0][{lane}];")
            out.next_row.append(f"{acc}_lanes.next_block();")
            out.read[acc] = f"{acc}_lanes.lane({lane})"
        else:
            out.declare.append(f"{acc_type} {acc}_lanes[{lanes}];")
            out.reset.append(f"{acc}_lanes[{lane}] = {m['init']};")
            out.bind.append(f"{acc_type}& {acc} = {acc}_lanes[{lane}];")
            out.read[acc] = f"{acc}_lanes[{lane}]"
    return out


def reduction_points(kernel) -> str:
    """The number of points of the kernel's reduction ranges, as C++."""
    return cexpr(sympy.expand(math.prod(kernel.reduction_ranges)))


def column_reduction_lines(
    outer_loops: list[str],
    outer_ranges: list[str],
    when: str,
    reduction_loops: list[str],
    rows: str,
    loop,
    after: list[str],
    ind: str,
) -> list[str]:
    """A column reduction (see the module's docstring); ``rows`` is the number of steps of
    the ``reduction_loops`` (C++)."""
    n = len(outer_loops)
    x = f"x{n - 1}"
    size = outer_ranges[-1]
    lanes, end = column_block(x, size)
    accs = column_accumulators(loop, lanes, x, rows)
    read = [f"const {accs.types[a]} {a} = {value};" for a, value in accs.read.items()]
    points = f"for (int64_t {x} = {x}_block; {x} < {x}_end; ++{x})"
    reset = [f"{ind}{points}", f"{ind}{{", *[ind * 2 + ln for ln in accs.reset], f"{ind}}}"]
    lines = [f"#pragma omp parallel for collapse({n}) if({when})", *outer_loops[:-1]]
    lines += [
        f"for (int64_t {x}_block = 0; {x}_block < {size}; {x}_block += {lanes})",
        "{",
        f"{ind}const int64_t {x}_end = {end};",
        *[ind + line for line in accs.declare],
        *(reset if accs.reset else []),
        *[ind + line for line in reduction_loops],
        f"{ind}{{",
        f"{ind * 2}#pragma omp simd",
        f"{ind * 2}{points}",
        f"{ind * 2}{{",
        *[ind * 3 + line for line in accs.bind + loop.body],
        f"{ind * 2}}}",
        *[ind * 2 + line for line in accs.next_row],
        f"{ind}}}",
        *([f"{ind}#pragma omp simd"] if simd_safe(after) else []),
        f"{ind}{points}",
        f"{ind}{{",
        *[ind * 2 + line for line in read + after],
        f"{ind}}}",
        "}",
    ]
    return lines
