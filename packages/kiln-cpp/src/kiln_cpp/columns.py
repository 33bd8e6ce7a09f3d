"""Column reductions: a reduction along a strided dimension whose last outer dimension is
contiguous (``x.sum(0)``, a channels-last batch norm's statistics) runs its vector lanes
over outer points instead of reduction points.

The last outer loop runs in blocks of :func:`column_lanes` points; each point of a block
keeps its accumulators in an array (one lane each), the reduction loops run outside and an
``omp simd`` loop over the block's points inside them, so each step reads a contiguous
piece of one row. A long float sum keeps its lanes in a ``kiln::CascadeLanes`` (each row a
block of the cascade), as eager adds a column: in float, its error growing with the log of
the rows. A Welford (``var_mean``) keeps its lanes in a ``kiln::WelfordColumns``: all lanes
count the same rows, so one division a row serves them all.

A kernel may walk the rows again after reducing (a batch norm normalising, or its input
gradient after the sums): the block then runs each pass in turn (:class:`ColumnPasses`),
the outer lines between them over the block's points, and what they compute for a later
pass is kept in an array of one value per lane. A value the first pass computed per row
is computed again by the later pass, never stored per row and lane.
:mod:`kiln_cpp.split` runs the same passes in chunks of rows across threads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import sympy

from kiln_cpp.dtypes import value_type
from kiln_cpp.printer import cexpr
from kiln_cpp.statements import (
    CheckIndex,
    Declare,
    Define,
    Expr,
    PointWrite,
    ReductionLoop,
    Statement,
    Update,
    names,
    per_point,
    render,
)
from kiln_cpp.vectorize import coefficient
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


_KINDS = ("sum", "dot", "prod", "max", "min", "welford.mean", "welford.m2")


@dataclass
class ColumnPasses:
    """A column kernel as passes over the rows of a block of outer points: ``loops[0]``
    reduces, each later loop walks the rows again (a batch norm's normalising pass);
    ``segments`` are the outer lines before the first loop and after each loop (the
    first after the reduction reads its accumulators)."""

    segments: list[list[Statement]]
    loops: list  # ReductionLoop
    # a value of a segment that a later loop or segment reads -> its C++ type: kept per
    # outer point between the passes
    kept: dict[str, str]


def column_passes(kernel, items: list) -> ColumnPasses | None:
    """The kernel as column passes (see :class:`ColumnPasses`) where it reduces along a
    strided dimension while its last outer dimension is contiguous (``x.sum(0)``, a
    channels-last batch norm): then the lanes run over outer points instead (see
    :func:`column_reduction_lines`). None for other kernels, and where the first
    reduction loop holds an accumulator a lane cannot keep (``any``, ``argmax``), a later
    loop reduces too, or an index is indirect."""
    if not kernel.ranges or not kernel.reduction_ranges or not items:
        return None
    segments: list[list[Statement]] = [[]]
    loops = []
    for item in items:
        if isinstance(item, ReductionLoop):
            loops.append(item)
            segments.append([])
        else:
            segments[-1].append(item)
    if not loops or not loops[0].reductions or any(loop.reductions for loop in loops[1:]):
        return None
    if any(a.kind not in _KINDS for a in loops[0].reductions):
        return None
    loops = _recomputed(loops)
    if loops is None or any(loop.prologue for loop in loops[1:]):
        return None
    if not all(isinstance(s, Declare) for s in loops[0].prologue):
        return None
    body = [s for seg in segments for s in seg] + [s for lp in loops for s in lp.body]
    if any(isinstance(s, CheckIndex) or per_point(s) for s in body):
        return None
    accumulators = {s.name for s in loops[0].prologue}
    elsewhere = segments[:1] + segments[2:] + [lp.body for lp in loops[1:]]
    if any(names(s) & accumulators for seg in elsewhere for s in seg):
        return None  # only the segment after the reduction reads its accumulators
    x_last = index_vars(len(kernel.ranges))[-1]
    r_last = reduction_vars(len(kernel.reduction_ranges))[-1]
    loads = kernel.trace().loads
    strided = any(coefficient(ld.index, r_last) != 1 for ld in loads if ld.index.has(r_last))
    contiguous = any(coefficient(ld.index, x_last) == 1 for ld in loads)
    if not (strided and contiguous):
        return None
    return ColumnPasses(segments, loops, _kept(segments, loops))


def _recomputed(loops: list) -> list | None:
    """Copies of ``loops`` where a later loop computes again what it read from an earlier
    loop's per-point array (lanes over outer points would need one such array per lane):
    the statements that define the value, from loads up. None where those read an
    accumulator."""
    accumulators = {d.name for loop in loops for d in loop.prologue if isinstance(d, Declare)}
    accumulators |= {a.acc for loop in loops for a in loop.reductions}
    out = []
    definitions: dict[str, tuple[int, Define]] = {}  # earlier loops' values -> (order, def)
    for loop in loops:
        body: list[Statement] = []
        defined: set[str] = set()
        for s in loop.body:
            home = s.element.home if isinstance(s, Define) and s.element else None
            if home is None:
                body.append(s)
                continue
            needed = _defining(home, definitions, accumulators)
            if needed is None:
                return None
            for d in needed:
                if d.name not in defined:
                    defined.add(d.name)
                    body.append(d)
            body.append(Define(s.name, s.ctype, Expr(("", home, ""))))
        body = [s for s in body if not (isinstance(s, PointWrite) and s.value == s.home)]
        for s in body:
            if isinstance(s, Define):
                definitions.setdefault(s.name, (len(definitions), s))
        prologue = [s for s in loop.prologue if not per_point(s)]
        out.append(dataclasses.replace(loop, prologue=prologue, body=body))
    return out


def _defining(name: str, definitions: dict, accumulators: set[str]) -> list[Define] | None:
    """The definitions that compute ``name`` from what the loops load, in their order;
    None where one reads an accumulator."""
    found: dict[str, tuple[int, Define]] = {}
    pending = [name]
    while pending:
        current = pending.pop()
        if current in found or current not in definitions:
            continue
        found[current] = definitions[current]
        operands = definitions[current][1].reads
        if any(op in accumulators for op in operands):
            return None
        pending += operands
    return [d for _, d in sorted(found.values(), key=lambda item: item[0])]


def _kept(segments: list[list[Statement]], loops: list) -> dict[str, str]:
    """The values a segment defines that a later loop or segment reads, and their types."""
    kept = {}
    for i, segment in enumerate(segments):
        later = [s for lp in loops[i:] for s in lp.body]
        later += [s for seg in segments[i + 1 :] for s in seg]
        read = set().union(*map(names, later)) if later else set()
        for s in segment:
            if isinstance(s, Define) and s.name in read:
                kept[s.name] = s.ctype
    return kept


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
    # before the simd loop, each step of the reduction loops (a Welford's row count)
    row_start: list[str] = field(default_factory=list)
    # the loop body's updates that become a lane's (a Welford's)
    updates: dict[Update, str] = field(default_factory=dict)
    # after the reduction loops, before the reads (a Welford's last rows folded in)
    done: list[str] = field(default_factory=list)
    # after the reads: the accumulators that are references to others (one var_mean)
    aliases: list[str] = field(default_factory=list)
    welfords: set[str] = field(default_factory=set)  # the kiln::Welford accumulators

    def body(self, body: list[Statement]) -> list[str]:
        """The simd loop's lines for the reduction loop's ``body``."""
        return [*self.bind, *(self.updates.get(s) or s.render() for s in body)]

    def read_lines(self) -> list[str]:
        """Each accumulator defined as its lane's value, then the references to them."""
        lines = []
        for acc, value in self.read.items():
            const = "" if acc in self.welfords else "const "
            lines.append(f"{const}{self.types[acc]} {acc} = {value};")
        return lines + self.aliases


def column_accumulators(loop, lanes: int, x: str, rows: str) -> ColumnLanes:
    """The lanes of ``loop``'s accumulators (a :class:`~kiln_cpp.handler.ReductionLoop`
    whose prologue declares them all): an array of ``lanes`` values each, a
    ``kiln::WelfordColumns`` for a Welford (each lane one output, all counting the rows),
    or, for a long float sum, a cascade whose blocks are the ``rows`` (C++) steps of the
    reduction loops."""
    cascades = {a.acc: a.lane_type for a in loop.reductions if a.cascade}
    reductions = {a.acc: a for a in loop.reductions}
    lane = f"{x} - {x}_block"
    out = ColumnLanes([], [], [], [], {}, {})
    for declaration in loop.prologue:
        if declaration.twin is not None:
            out.aliases.append(declaration.render())
            continue
        acc, acc_type = declaration.name, declaration.ctype
        out.types[acc] = acc_type
        if declaration.init is None:  # a kiln::Welford
            a = reductions[acc]
            out.welfords.add(acc)
            vt = value_type(a.dtype)
            out.declare.append(f"kiln::WelfordColumns<{lanes}, {vt}> {acc}_lanes;")
            out.row_start.append(f"{acc}_lanes.next_block();")
            out.done.append(f"{acc}_lanes.fold();")
            for update in a.update:
                out.updates[update] = f"{acc}_lanes.update({lane}, {a.value});"
            out.read[acc] = f"{acc}_lanes.lane({lane})"
            continue
        if acc in cascades:
            out.declare.append(f"kiln::CascadeLanes<{lanes}, {cascades[acc]}> {acc}_lanes({rows});")
            out.bind.append(f"{cascades[acc]}& {acc} = {acc}_lanes.level[0][{lane}];")
            out.next_row.append(f"{acc}_lanes.next_block();")
            out.read[acc] = f"{acc}_lanes.lane({lane})"
        else:
            out.declare.append(f"{acc_type} {acc}_lanes[{lanes}];")
            out.reset.append(f"{acc}_lanes[{lane}] = {declaration.init};")
            out.bind.append(f"{acc_type}& {acc} = {acc}_lanes[{lane}];")
            out.read[acc] = f"{acc}_lanes[{lane}]"
    return out


def reduction_points(kernel) -> str:
    """The number of points of the kernel's reduction ranges, as C++."""
    return cexpr(sympy.expand(math.prod(kernel.reduction_ranges)))


def kept_binds(passes: ColumnPasses, body: list[Statement], kept: str) -> list[str]:
    """The kept values ``body`` reads, each bound to its place ``kept`` (a format of
    ``name``: the value's array at the current point)."""
    read = set().union(*map(names, body)) if body else set()
    defined = {s.name for s in body if isinstance(s, Define)}
    return [
        f"const {t} {name} = {kept.format(name=name)};"
        for name, t in passes.kept.items()
        if name in read and name not in defined
    ]


def kept_stores(passes: ColumnPasses, segment: list[Statement], kept: str) -> list[str]:
    """The lines that keep the values ``segment`` defines for later passes."""
    defined = [s.name for s in segment if isinstance(s, Define)]
    return [f"{kept.format(name=name)} = {name};" for name in defined if name in passes.kept]


def column_reduction_lines(
    passes: ColumnPasses,
    outer_loops: list[str],
    outer_ranges: list[str],
    when: str,
    reduction_loops: list[str],
    rows: str,
    ind: str,
) -> list[str]:
    """A column kernel (see the module's docstring), each block of outer points running
    every pass in turn; ``rows`` is the number of steps of the ``reduction_loops``
    (C++). A value an outer segment computes for a later pass is kept per lane."""
    n = len(outer_loops)
    x = f"x{n - 1}"
    size = outer_ranges[-1]
    lanes, end = column_block(x, size)
    accs = column_accumulators(passes.loops[0], lanes, x, rows)
    kept = f"{{name}}_kept[{x} - {x}_block]"
    points = f"for (int64_t {x} = {x}_block; {x} < {x}_end; ++{x})"

    def over_points(body: list[str], simd: bool) -> list[str]:
        pragma = [f"{ind}#pragma omp simd"] if simd else []
        return [*pragma, f"{ind}{points}", f"{ind}{{", *[ind * 2 + ln for ln in body], f"{ind}}}"]

    lines = [f"#pragma omp parallel for collapse({n}) if({when})", *outer_loops[:-1]]
    lines += [
        f"for (int64_t {x}_block = 0; {x}_block < {size}; {x}_block += {lanes})",
        "{",
        f"{ind}const int64_t {x}_end = {end};",
        *[ind + line for line in accs.declare],
        *[f"{ind}{t} {name}_kept[{lanes}];" for name, t in passes.kept.items()],
    ]
    if accs.reset:
        lines += over_points(accs.reset, simd=False)
    for i, segment in enumerate(passes.segments):
        body = [
            *kept_binds(passes, segment, kept),
            *(accs.read_lines() if i == 1 else []),
            *render(segment),
            *kept_stores(passes, segment, kept),
        ]
        if body:
            lines += over_points(body, simd=True)
        if i == len(passes.loops):
            break
        loop = passes.loops[i]
        body = accs.body(loop.body) if i == 0 else render(loop.body)
        lines += [
            *[ind + line for line in reduction_loops],
            f"{ind}{{",
            *[ind * 2 + line for line in (accs.row_start if i == 0 else [])],
            f"{ind * 2}#pragma omp simd",
            f"{ind * 2}{points}",
            f"{ind * 2}{{",
            *[ind * 3 + line for line in kept_binds(passes, loop.body, kept) + body],
            f"{ind * 2}}}",
            *[ind * 2 + line for line in (accs.next_row if i == 0 else [])],
            f"{ind}}}",
            *[ind + line for line in (accs.done if i == 0 else [])],
        ]
    return [*lines, "}"]
