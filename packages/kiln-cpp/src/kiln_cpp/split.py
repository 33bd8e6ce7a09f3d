"""Reductions split across threads, for kernels whose outer loop leaves threads idle.

A full reduction (``x.sum()``: no outer points), a column reduction with few outer points
(``x.sum(0)`` of a tall, narrow matrix) or a row reduction with few long rows
(``x.sum(-1)`` of 3 x 1M) would run on one thread, or on fewer threads than there are (or
share them unevenly), with its outer loop alone in parallel. Its first reduction loop is
cut into contiguous chunks instead (``r0`` from ``r0_start`` to ``r0_stop``), each reduced
by a thread of its own into a partial result; after the parallel region the partials are
combined in chunk order, so the result depends on the number of chunks only, never on
which thread ran which chunk or when.

The number of chunks is decided when the kernel runs (``kiln::split_chunks`` in the
prelude): one where the outer loop's parallel units (rows, or blocks of
:func:`~kiln_cpp.columns.column_lanes` columns) already occupy every thread evenly (a
multiple of the threads, or at least four per thread); else enough per unit that units
times chunks are a multiple of the threads (3 rows on 2 threads: 2 chunks each), each chunk
at least :data:`SPLIT_MIN_POINTS` of the kernel's points (threads chosen by work size). A
kernel known to be smaller than two chunks, or to have :data:`SPLIT_MAX_CHUNKS` units or
more, keeps its serial form.

Only reductions whose partials combine as their points do are split: sums (in the
accumulator's type, ``double`` for long float sums; a sum in lanes adds its lanes into the
chunk's partial), products, ``max``/``min`` (a NaN carried by the chunk's epilogue into its
partial), ``any``/``all``, and Welford mean and m2 (partials combined by Chan's formula, as
the lanes of one chunk are). Each chunk runs the loop
:func:`~kiln_cpp.vectorize.reduction_loop` or the column lanes (:mod:`kiln_cpp.columns`)
render.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from kiln_cpp.columns import (
    ColumnPasses,
    column_accumulators,
    column_block,
    column_lanes,
    kept_binds,
    kept_stores,
)
from kiln_cpp.printer import cexpr
from kiln_cpp.statements import Declare, ReductionLoop, per_point, render
from kiln_cpp.vectorize import reduction_loop
from kiln_loopir.kernel import Kernel
from kiln_loopir.symbols import index_vars

# each chunk reduces at least this many points of the kernel (about 6 us of a float sum on
# one core, several times the cost of waking a thread)
SPLIT_MIN_POINTS = 32768
# at most this many chunks (the length of a full reduction's array of partials)
SPLIT_MAX_CHUNKS = 64
_KINDS = ("sum", "dot", "prod", "max", "min", "any", "all", "welford.mean", "welford.m2")
CHUNK = "kiln_chunk"
CHUNKS = "kiln_chunks"


def _points(kernel: Kernel) -> sympy.Expr:
    return sympy.expand(math.prod(kernel.ranges) * math.prod(kernel.reduction_ranges))


@dataclass
class _Partial:
    """An accumulator of the loop whose value each chunk hands on."""

    acc: str
    type: str  # its C++ type
    welford: bool  # a kiln::Welford (combined by Chan's formula), else combined by its update


def _partials(loop, after: list) -> list[_Partial] | None:
    """The accumulators of ``loop`` (a :class:`~kiln_cpp.handler.ReductionLoop`), or None
    where it does not split: each must be declared by its prologue and updated by one
    reduction whose update lines combine a partial as they combine a point (or be a
    Welford accumulator, or a reference to one), and nothing after the loop is another
    loop."""
    if not loop.reductions or any(isinstance(i, ReductionLoop) for i in after):
        return None
    if any(per_point(s) for s in loop.body):
        return None
    partials: dict[str, _Partial] = {}
    for s in loop.prologue:
        if not isinstance(s, Declare) or (s.twin is not None and s.twin not in partials):
            return None
        if s.twin is None:  # without an initial value: a kiln::Welford
            partials[s.name] = _Partial(s.name, s.ctype, s.init is None)
    if sorted(a.acc for a in loop.reductions) != sorted(partials):
        return None
    for a in loop.reductions:
        if a.kind not in _KINDS or partials[a.acc].welford != a.kind.startswith("welford"):
            return None
        if partials[a.acc].welford:
            continue
        if any(u.reads.count(a.value) != 1 for u in a.update):
            return None
    return list(partials.values())


def _combine_lines(loop, partials: list[_Partial], part: Callable[[str], str]) -> list[str]:
    """The lines that combine each accumulator's partial ``part(acc)`` into it: Chan's
    formula for a Welford accumulator, else its update lines taking the partial where
    they took the point's value."""
    lines = [
        f"{p.acc}.combine({part(p.acc)}.mean, {part(p.acc)}.m2, {part(p.acc)}.n);"
        for p in partials
        if p.welford
    ]
    welford = {p.acc for p in partials if p.welford}
    for a in loop.reductions:
        if a.acc not in welford:
            lines += [str(u.expr.renamed({a.value: part(a.acc)})) for u in a.update]
    return lines


def _worth_splitting(kernel: Kernel, units: str) -> bool:
    """Whether some thread count gives the kernel two chunks or more: not where it is
    known to be smaller than two chunks per parallel unit (``kiln::split_chunks`` gives a
    unit at most one chunk per :data:`SPLIT_MIN_POINTS` points), or to have
    :data:`SPLIT_MAX_CHUNKS` parallel units or more (only that many threads would split
    it). A small product (16 rows by 64 columns of 64 products each) keeps its serial
    form: no array of partials to allocate and combine at every call."""
    points = _points(kernel)
    per_unit = int(units) if units.isdigit() else 1
    if points.is_Integer and int(points) < 2 * per_unit * SPLIT_MIN_POINTS:
        return False
    return not (units.isdigit() and int(units) >= SPLIT_MAX_CHUNKS)


def _chunk_bounds(steps: str) -> list[str]:
    return [
        f"const int64_t r0_start = ({steps}) * {CHUNK} / {CHUNKS};",
        f"const int64_t r0_stop = ({steps}) * ({CHUNK} + 1) / {CHUNKS};",
    ]


def _chunk_points(kernel: Kernel) -> str:
    """The number of points a chunk reduces, as C++."""
    rest = sympy.expand(math.prod(kernel.reduction_ranges[1:]))
    return "r0_stop - r0_start" if rest == 1 else f"(r0_stop - r0_start) * ({cexpr(rest)})"


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
    if kernel.ranges or not kernel.reduction_ranges or not items:
        return False
    loop, after = items[0], items[1:]
    if not isinstance(loop, ReductionLoop) or _partials(loop, after) is None:
        return False
    return _worth_splitting(kernel, "1")


def full_reduction_lines(kernel: Kernel, loop, after: list[str], ind: str) -> list[str]:
    """A full reduction in chunks: each chunk's partials in arrays of
    :data:`SPLIT_MAX_CHUNKS`, combined in chunk order after the parallel loop."""
    partials = _partials(loop, after)
    assert partials is not None, "full_reduction said no"
    chunk_loop = _chunk_loop(kernel, loop, ind)
    combine = _combine_lines(loop, partials, lambda acc: f"{acc}_parts[{CHUNK}]")
    return [
        "{",
        ind + _chunks_line(kernel, "1"),
        *[f"{ind}{p.type} {p.acc}_parts[{SPLIT_MAX_CHUNKS}];" for p in partials],
        f"{ind}#pragma omp parallel for num_threads({CHUNKS}) schedule(static, 1) if({CHUNKS} > 1)",
        f"{ind}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        f"{ind}{{",
        *[ind * 2 + line for line in _chunk_bounds(cexpr(kernel.reduction_ranges[0]))],
        *[ind * 2 + line for line in chunk_loop],
        *[f"{ind * 2}{p.acc}_parts[{CHUNK}] = {p.acc};" for p in partials],
        f"{ind}}}",
        *[ind + line for line in render(loop.prologue)],
        f"{ind}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        f"{ind}{{",
        *[ind * 2 + line for line in combine],
        f"{ind}}}",
        *[ind + line for line in render(after)],
        "}",
    ]


def row_split(kernel: Kernel, items: list) -> bool:
    """Whether a reduction along its contiguous rows (not a column reduction, which the
    caller ruled out) has few enough rows to leave threads idle: one loop of combinable
    accumulators first in the body, then lines that read them, enough points, and a known
    number of rows (rows of a symbolic number may be many: their combining loop, serial,
    would cost more than the split gains)."""
    rows = sympy.expand(math.prod(kernel.ranges))
    if not kernel.ranges or not kernel.reduction_ranges or not items or not rows.is_Integer:
        return False
    loop, after = items[0], items[1:]
    if not isinstance(loop, ReductionLoop) or _partials(loop, after) is None:
        return False
    return _worth_splitting(kernel, str(int(rows)))


def _outer_position(kernel: Kernel) -> str:
    """The row-major position of the current outer point, as C++."""
    linear = sympy.S.Zero
    for var, r in zip(index_vars(len(kernel.ranges)), kernel.ranges, strict=True):
        linear = linear * r + var
    return cexpr(sympy.expand(linear))


def _partial_slot(kernel: Kernel) -> tuple[sympy.Expr, str]:
    """``(outer points, slot)``: where a chunk's partial for the current outer point lies in
    an array of partials, chunk-major (``CHUNK`` times the outer points, plus the point)."""
    outer = sympy.expand(math.prod(kernel.ranges))
    return outer, f"{CHUNK} * ({cexpr(outer)}) + {_outer_position(kernel)}"


def _chunk_loop(kernel: Kernel, loop, ind: str) -> list[str]:
    """The reduction loop of one chunk: over the chunk's own range where the split loop is
    the last (a strip-mined one's blocks), else over the whole last loop."""
    m = len(kernel.reduction_ranges)
    first, last_range = (
        ("r0_start", "r0_stop") if m == 1 else ("0", cexpr(kernel.reduction_ranges[-1]))
    )
    return reduction_loop(
        _reduction_headers(kernel),
        f"r{m - 1}",
        last_range,
        loop.prologue,
        loop.body,
        loop.reductions,
        ind,
        f"kiln_oob{loop.id}",
        first,
        _chunk_points(kernel),
    )


def row_split_lines(kernel: Kernel, loop, after: list[str], when: str, ind: str) -> list[str]:
    """A row reduction in chunks: the chunks and the rows (outer points) in one parallel
    loop, each reducing its chunk of its row into partials (an array per accumulator,
    chunk-major), then each row's partials combined in chunk order."""
    partials = _partials(loop, after)
    assert partials is not None, "row_split said no"
    n = len(kernel.ranges)
    outer, slot = _partial_slot(kernel)
    rows = [
        f"for (int64_t x{i} = 0; x{i} < {cexpr(r)}; ++x{i})" for i, r in enumerate(kernel.ranges)
    ]
    chunk_loop = _chunk_loop(kernel, loop, ind)
    combine = _combine_lines(loop, partials, lambda acc: f"{acc}_parts[{slot}]")
    return [
        "{",
        ind + _chunks_line(kernel, cexpr(outer)),
        *[
            f"{ind}std::vector<{_element(p.type)}> {p.acc}_parts({CHUNKS} * ({cexpr(outer)}));"
            for p in partials
        ],
        f"{ind}#pragma omp parallel for collapse({n + 1}) if({when})",
        f"{ind}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        *[ind + line for line in rows],
        f"{ind}{{",
        *[ind * 2 + line for line in _chunk_bounds(cexpr(kernel.reduction_ranges[0]))],
        *[ind * 2 + line for line in chunk_loop],
        *[f"{ind * 2}{p.acc}_parts[{slot}] = {p.acc};" for p in partials],
        f"{ind}}}",
        *[ind + line for line in rows],
        f"{ind}{{",
        *[ind * 2 + line for line in render(loop.prologue)],
        f"{ind * 2}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
        f"{ind * 2}{{",
        *[ind * 3 + line for line in combine],
        f"{ind * 2}}}",
        *[ind * 2 + line for line in render(after)],
        f"{ind}}}",
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
    lanes = column_lanes(cexpr(last))
    if last.is_Integer and lead_points.is_Integer:
        return str(int(lead_points) * -(-int(last) // lanes))
    return f"({cexpr(lead_points)}) * (({cexpr(last)} + {lanes - 1}) / {lanes})"


def column_split(kernel: Kernel, passes: ColumnPasses) -> bool:
    """Whether a column kernel (see :func:`kiln_cpp.columns.column_passes`) may leave
    threads idle and is worth splitting."""
    if _partials(passes.loops[0], []) is None:
        return False
    return _worth_splitting(kernel, _column_units(kernel))


def column_split_lines(kernel: Kernel, passes: ColumnPasses, when: str, ind: str) -> list[str]:
    """A column kernel in chunks of rows: each pass over the rows runs the chunks and the
    blocks of columns in one parallel loop. The reduction's blocks store their lanes as
    the chunk's partials (an array per accumulator, chunk-major); each outer segment then
    runs per outer point, the first after the reduction combining the point's partials
    in chunk order. A value a segment computes for a later pass is kept per outer point."""
    n = len(kernel.ranges)
    x = f"x{n - 1}"
    size = cexpr(kernel.ranges[-1])
    lanes, end = column_block(x, size)
    loop = passes.loops[0]
    accs = column_accumulators(loop, lanes, x, _chunk_points(kernel))
    outer, slot = _partial_slot(kernel)
    kept = f"{{name}}_kept[{_outer_position(kernel)}]"
    lead = [
        f"for (int64_t x{i} = 0; x{i} < {cexpr(r)}; ++x{i})" for i, r in enumerate(kernel.ranges)
    ]
    points = f"for (int64_t {x} = {x}_block; {x} < {x}_end; ++{x})"
    partials = _partials(loop, [])
    assert partials is not None, "column_split said no"
    combine = _combine_lines(loop, partials, lambda acc: f"{acc}_parts[{slot}]")
    headers = _reduction_headers(kernel)

    def chunked(i: int, start: list[str], done: list[str]) -> list[str]:
        """Pass ``i`` over the rows, in chunks: its loop's body in the simd loop (the first
        pass's updating the lanes), ``start`` before the block's rows, ``done`` after them."""
        statements = passes.loops[i].body
        body = accs.body(statements) if i == 0 else render(statements)
        return [
            f"{ind}#pragma omp parallel for collapse({n + 1}) if({when})",
            f"{ind}for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
            *[ind + line for line in lead[:-1]],
            f"{ind}for (int64_t {x}_block = 0; {x}_block < {size}; {x}_block += {lanes})",
            f"{ind}{{",
            *[ind * 2 + line for line in _chunk_bounds(cexpr(kernel.reduction_ranges[0]))],
            f"{ind * 2}const int64_t {x}_end = {end};",
            *[ind * 2 + line for line in start],
            *[ind * 2 + line for line in headers],
            f"{ind * 2}{{",
            *[ind * 3 + line for line in (accs.row_start if i == 0 else [])],
            f"{ind * 3}#pragma omp simd",
            f"{ind * 3}{points}",
            f"{ind * 3}{{",
            *[ind * 4 + line for line in kept_binds(passes, statements, kept) + body],
            f"{ind * 3}}}",
            *[ind * 3 + line for line in (accs.next_row if i == 0 else [])],
            f"{ind * 2}}}",
            *[ind * 2 + line for line in done],
            f"{ind}}}",
        ]

    reset = [points, "{", *[ind + ln for ln in accs.reset], "}"] if accs.reset else []
    store = [*accs.done, points, "{"]
    store += [f"{ind}{acc}_parts[{slot}] = {value};" for acc, value in accs.read.items()]
    store.append("}")
    lines = [
        "{",
        ind + _chunks_line(kernel, _column_units(kernel)),
        *[
            f"{ind}std::vector<{_element(acc_type)}> {acc}_parts({CHUNKS} * ({cexpr(outer)}));"
            for acc, acc_type in accs.types.items()
        ],
        *[
            f"{ind}std::vector<{_element(t)}> {name}_kept({cexpr(outer)});"
            for name, t in passes.kept.items()
        ],  # fmt: skip
    ]
    for i, segment in enumerate(passes.segments):
        combined = []  # after the reduction: each point's partials combined first
        if i == 1:
            combined = [*render(loop.prologue),
                        f"for (int64_t {CHUNK} = 0; {CHUNK} < {CHUNKS}; ++{CHUNK})",
                        "{", *[ind + line for line in combine], "}"]  # fmt: skip
        body = [
            *kept_binds(passes, segment, kept),
            *combined,
            *render(segment),
            *kept_stores(passes, segment, kept),
        ]
        if body:
            lines += [*[ind + line for line in lead], f"{ind}{{"]
            lines += [*[ind * 2 + line for line in body], f"{ind}}}"]
        if i == 0:
            lines += chunked(0, [*accs.declare, *reset], store)
        elif i < len(passes.loops):
            lines += chunked(i, [], [])
    return [*lines, "}"]
