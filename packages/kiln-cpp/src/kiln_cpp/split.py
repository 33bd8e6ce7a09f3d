"""Reductions split across threads, for kernels whose outer loop leaves threads idle.

A full reduction (``x.sum()``: no outer points) or a column reduction with few outer
points (``x.sum(0)`` of a tall, narrow matrix) would run on one thread, or on fewer
threads than there are, with its outer loop alone in parallel. Its first reduction loop is
cut into contiguous chunks instead (``r0`` from ``r0_start`` to ``r0_stop``), each reduced
by a thread of its own into a partial result; after the parallel region the partials are
combined in chunk order, so the result depends on the number of chunks only, never on
which thread ran which chunk or when.

The number of chunks is decided when the kernel runs (``kiln::split_chunks`` in the
prelude): one where the outer loop's parallel units (outer points, or blocks of
:data:`~kiln_cpp.vectorize.COLUMN_LANES` columns) already occupy every thread; else enough
per unit to occupy them all, each chunk at least :data:`SPLIT_MIN_POINTS` of the kernel's
points (threads chosen by work size). A kernel known to be smaller than two chunks keeps
its serial form.

Only reductions whose partials combine as their points do are split: sums (in the
accumulator's type, ``double`` for long float sums), products, ``max``/``min`` (a NaN
carried by the chunk's epilogue into its partial), ``any``/``all``; each chunk runs the
loop :func:`~kiln_cpp.vectorize.reduction_loop` or the column lanes render.
"""

from __future__ import annotations

import math
import re

import sympy

from kiln_cpp.printer import cexpr
from kiln_cpp.vectorize import COLUMN_LANES, Accumulation, reduction_loop
from kiln_loopir.kernel import Kernel
from kiln_loopir.symbols import index_vars

# each chunk reduces at least this many points of the kernel (about 6 us of a float sum on
# one core, several times the cost of waking a thread)
SPLIT_MIN_POINTS = 32768
# at most this many chunks (the length of a full reduction's array of partials)
SPLIT_MAX_CHUNKS = 64
_KINDS = ("sum", "dot", "prod", "max", "min", "any", "all")
_ACCUMULATOR = re.compile(r"^(?P<type>[\w:<>]+) (?P<acc>acc\d+) = (?P<init>.+);$")
_VALUE = re.compile(r"^tmp\d+$")
CHUNK = "kiln_chunk"
CHUNKS = "kiln_chunks"


def _points(kernel: Kernel) -> sympy.Expr:
    return sympy.expand(math.prod(kernel.ranges) * math.prod(kernel.reduction_ranges))


def _combinable(loop, after: list) -> bool:
    """Whether ``loop`` (a :class:`~kiln_cpp.handler.ReductionLoop`) reduces only into
    accumulators declared by its prologue, one line each, whose update lines combine a
    partial as they combine a point, and nothing after it is another loop."""
    accs = loop.reductions
    if not accs or len(loop.prologue) != len(accs) or any(not isinstance(i, str) for i in after):
        return False
    declared = [_ACCUMULATOR.match(line) for line in loop.prologue]
    if any(m is None for m in declared) or [m["acc"] for m in declared] != [a.acc for a in accs]:
        return False
    for a in accs:
        if a.kind not in _KINDS or a.lane_type or not _VALUE.match(a.value):
            return False
        if any(len(re.findall(rf"\b{a.value}\b", line)) != 1 for line in a.update):
            return False
    return not any("_spill" in line or "_xs" in line for line in loop.body)


def _worth_splitting(kernel: Kernel, units: str) -> bool:
    """Whether some thread count gives the kernel two chunks or more: not where it is
    known to be smaller than two chunks, or to have :data:`SPLIT_MAX_CHUNKS` parallel
    units or more (only that many threads would split it)."""
    points = _points(kernel)
    if points.is_Integer and int(points) < 2 * SPLIT_MIN_POINTS:
        return False
    return not (units.isdigit() and int(units) >= SPLIT_MAX_CHUNKS)


def _combine(a: Accumulation, partial: str) -> list[str]:
    """``a``'s update lines taking ``partial`` where they took the point's value."""
    return [re.sub(rf"\b{a.value}\b", partial, line) for line in a.update]


def _chunk_bounds(steps: str) -> list[str]:
    return [
        f"const int64_t r0_start = ({steps}) * {CHUNK} / {CHUNKS};",
        f"const int64_t r0_stop = ({steps}) * ({CHUNK} + 1) / {CHUNKS};",
    ]


def _reduction_headers(kernel: Kernel) -> list[str]:
    """The reduction loops' headers, the first over its chunk."""
    headers = ["for (int64_t r0 = r0_start; r0 < r0_stop; ++r0)"]
    headers += [
        f"for (int64_t r{i} = 0; r{i} < {cexpr(r)}; ++r{i})"
        for i, r in enumerate(kernel.reduction_ranges)
        if i
    ]
    return headers


def _chunks_line(kernel: Kernel, units: str) -> str:
    args = (cexpr(_points(kernel)), units, cexpr(kernel.reduction_ranges[0]))
    return (
        f"const int64_t {CHUNKS} = kiln::split_chunks({', '.join(args)}, {SPLIT_MIN_POINTS}, "
        f"{SPLIT_MAX_CHUNKS});"
    )


def full_reduction(kernel: Kernel, items: list) -> bool:
    """Whether the kernel is a full reduction (no outer points) to split: one loop of
    combinable accumulators, then lines that read them, and enough points."""
    from kiln_cpp.handler import ReductionLoop  # the handler imports vectorize

    if kernel.ranges or not kernel.reduction_ranges or not items:
        return False
    loop, after = items[0], items[1:]
    if not isinstance(loop, ReductionLoop) or not _combinable(loop, after):
        return False
    return _worth_splitting(kernel, "1")


def full_reduction_lines(kernel: Kernel, loop, after: list[str], ind: str) -> list[str]:
    """A full reduction in chunks: each chunk's partials in arrays of
    :data:`SPLIT_MAX_CHUNKS`, combined in chunk order after the parallel loop."""
    accs = [_ACCUMULATOR.match(line) for line in loop.prologue]
    steps = cexpr(kernel.reduction_ranges[-1])
    headers = _reduction_headers(kernel)
    chunk_loop = reduction_loop(
        headers,
        f"r{len(kernel.reduction_ranges) - 1}",
        steps,
        loop.prologue,
        loop.body,
        loop.reductions,
        ind,
        f"kiln_oob{loop.id}",
    )
    partial = {m["acc"]: f"{m['acc']}_parts" for m in accs}
    combine = [line for a in loop.reductions for line in _combine(a, f"{partial[a.acc]}[{CHUNK}]")]
    return [
        "{",
        ind + _chunks_line(kernel, "1"),
        *[f"{ind}{m['type']} {partial[m['acc']]}[{SPLIT_MAX_CHUNKS}];" for m in accs],
        f"{ind}#pragma omp parallel for num_threads({CHUNKS}) schedule(static, 1) if({CHUNKS} > 1)",
        f"{ind}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        f"{ind}{{",
        *[ind * 2 + line for line in _chunk_bounds(cexpr(kernel.reduction_ranges[0]))],
        *[ind * 2 + line for line in chunk_loop],
        *[f"{ind * 2}{partial[m['acc']]}[{CHUNK}] = {m['acc']};" for m in accs],
        f"{ind}}}",
        *[ind + line for line in loop.prologue],
        f"{ind}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        f"{ind}{{",
        *[ind * 2 + line for line in combine],
        f"{ind}}}",
        *[ind + line for line in after],
        "}",
    ]


def _element(acc_type: str) -> str:
    """The element type of a vector of partials: never ``bool`` (``std::vector<bool>``
    packs bits, which threads writing neighbours would race on)."""
    return "unsigned char" if acc_type == "bool" else acc_type


def _column_units(kernel: Kernel) -> str:
    """The parallel units of a column reduction as C++: blocks of the last outer
    dimension's points, times the other outer points."""
    *lead, last = kernel.ranges
    lead_points = sympy.expand(math.prod(lead))
    if last.is_Integer and lead_points.is_Integer:
        return str(int(lead_points) * -(-int(last) // COLUMN_LANES))
    return f"({cexpr(lead_points)}) * (({cexpr(last)} + {COLUMN_LANES - 1}) / {COLUMN_LANES})"


def column_split(kernel: Kernel, items: list) -> bool:
    """Whether a column reduction (see :func:`kiln_cpp.vectorize.column_reduction`, which
    the caller checked) may leave threads idle and is worth splitting."""
    loop, after = items[0], items[1:]
    if not _combinable(loop, after):
        return False
    return _worth_splitting(kernel, _column_units(kernel))


def column_split_lines(kernel: Kernel, loop, after: list[str], when: str, ind: str) -> list[str]:
    """A column reduction in chunks: the chunks and the blocks of columns in one parallel
    loop, each block's lanes stored as the chunk's partials (an array per accumulator,
    chunk-major), then the partials of each outer point combined in chunk order."""
    n = len(kernel.ranges)
    x = f"x{n - 1}"
    size = cexpr(kernel.ranges[-1])
    lanes = COLUMN_LANES
    accs = [_ACCUMULATOR.match(line) for line in loop.prologue]
    outer = sympy.expand(math.prod(kernel.ranges))
    linear = sympy.S.Zero
    for var, r in zip(index_vars(n), kernel.ranges, strict=True):
        linear = linear * r + var
    slot = f"{CHUNK} * ({cexpr(outer)}) + {cexpr(sympy.expand(linear))}"
    whole = size.isdigit() and int(size) % lanes == 0
    end = f"{x}_block + {lanes}" if whole else f"std::min<int64_t>({x}_block + {lanes}, {size})"
    lead = [
        f"for (int64_t x{i} = 0; x{i} < {cexpr(r)}; ++x{i})" for i, r in enumerate(kernel.ranges)
    ]
    points = f"for (int64_t {x} = {x}_block; {x} < {x}_end; ++{x})"
    bind = [f"{m['type']}& {m['acc']} = {m['acc']}_lanes[{x} - {x}_block];" for m in accs]
    partial = {m["acc"]: f"{m['acc']}_parts" for m in accs}
    combine = [line for a in loop.reductions for line in _combine(a, f"{partial[a.acc]}[{slot}]")]
    headers = _reduction_headers(kernel)
    return [
        "{",
        ind + _chunks_line(kernel, _column_units(kernel)),
        *[
            f"{ind}std::vector<{_element(m['type'])}> {partial[m['acc']]}"
            f"({CHUNKS} * ({cexpr(outer)}));"
            for m in accs
        ],
        f"{ind}#pragma omp parallel for collapse({n + 1}) if({when})",
        f"{ind}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        *[ind + line for line in lead[:-1]],
        f"{ind}for (int64_t {x}_block = 0; {x}_block < {size}; {x}_block += {lanes})",
        f"{ind}{{",
        *[ind * 2 + line for line in _chunk_bounds(cexpr(kernel.reduction_ranges[0]))],
        f"{ind * 2}const int64_t {x}_end = {end};",
        *[f"{ind * 2}{m['type']} {m['acc']}_lanes[{lanes}];" for m in accs],
        f"{ind * 2}{points}",
        f"{ind * 2}{{",
        *[f"{ind * 3}{m['acc']}_lanes[{x} - {x}_block] = {m['init']};" for m in accs],
        f"{ind * 2}}}",
        *[ind * 2 + line for line in headers],
        f"{ind * 2}{{",
        f"{ind * 3}#pragma omp simd",
        f"{ind * 3}{points}",
        f"{ind * 3}{{",
        *[ind * 4 + line for line in bind + loop.body],
        f"{ind * 3}}}",
        f"{ind * 2}}}",
        f"{ind * 2}{points}",
        f"{ind * 2}{{",
        *[
            f"{ind * 3}{partial[m['acc']]}[{slot}] = {m['acc']}_lanes[{x} - {x}_block];"
            for m in accs
        ],
        f"{ind * 2}}}",
        f"{ind}}}",
        *[ind + line for line in lead],
        f"{ind}{{",
        *[ind * 2 + line for line in loop.prologue],
        f"{ind * 2}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        f"{ind * 2}{{",
        *[ind * 3 + line for line in combine],
        f"{ind * 2}}}",
        *[ind * 2 + line for line in after],
        f"{ind}}}",
        "}",
    ]
