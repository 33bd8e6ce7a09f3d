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

import math
import re
from dataclasses import dataclass, field

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


_KINDS = ("sum", "dot", "prod", "max", "min", "welford.mean", "welford.m2")
WELFORD = re.compile(r"^(?P<type>kiln::Welford<(?P<vt>[\w:]+)>) (?P<acc>acc\d+);$")
WELFORD_REFERENCE = re.compile(r"^kiln::Welford<[\w:]+>& (?P<acc>acc\d+) = (?P<twin>acc\d+);$")
_DEFINITION = re.compile(r"^const (?P<type>[\w:<>]+) (?P<name>tmp\d+) = (?P<rhs>.+);$")
_NAME = re.compile(r"\b(?:tmp|acc)\d+\b")
# a value of an earlier loop stored per reduction point (a spill, or a costly value kept
# by vectorize.reuse_across_loops), its store, and a later loop's read of it
_PER_POINT = r"(?P<home>tmp\d+)_(?:spill|xs)"
_PER_POINT_STORE = re.compile(rf"^{_PER_POINT}\[.+\] = (?P=home);$")
_PER_POINT_READ = re.compile(rf"^const (?P<type>[\w:<>]+) (?P<name>tmp\d+) = {_PER_POINT}\[.+\];$")
_PER_POINT_ARRAY = re.compile(r"\btmp\d+_(?:spill|xs)\b")


@dataclass
class ColumnPasses:
    """A column kernel as passes over the rows of a block of outer points: ``loops[0]``
    reduces, each later loop walks the rows again (a batch norm's normalising pass);
    ``segments`` are the outer lines before the first loop and after each loop (the
    first after the reduction reads its accumulators)."""

    segments: list[list[str]]
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
    from kiln_cpp.handler import ReductionLoop  # the handler imports vectorize

    if not kernel.ranges or not kernel.reduction_ranges or not items:
        return None
    segments: list[list[str]] = [[]]
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
    if not all(
        ACCUMULATOR.match(ln) or WELFORD.match(ln) or WELFORD_REFERENCE.match(ln)
        for ln in loops[0].prologue
    ):
        return None
    lines = [ln for seg in segments for ln in seg] + [ln for lp in loops for ln in lp.body]
    if any("kiln_oob" in ln or _PER_POINT_ARRAY.search(ln) for ln in lines):
        return None
    accumulators = {m.group("acc") for ln in loops[0].prologue if (m := _ACC.match(ln))}
    elsewhere = segments[:1] + segments[2:] + [lp.body for lp in loops[1:]]
    if any(_names(ln) & accumulators for seg in elsewhere for ln in seg):
        return None  # only the segment after the reduction reads its accumulators
    x_last = index_vars(len(kernel.ranges))[-1]
    r_last = reduction_vars(len(kernel.reduction_ranges))[-1]
    loads = kernel.trace().loads
    strided = any(coefficient(ld.index, r_last) != 1 for ld in loads if ld.index.has(r_last))
    contiguous = any(coefficient(ld.index, x_last) == 1 for ld in loads)
    if not (strided and contiguous):
        return None
    return ColumnPasses(segments, loops, _kept(segments, loops))


_ACC = re.compile(r"^[\w:<>&]+ (?P<acc>acc\d+)[ ;]")


def _names(line: str) -> set[str]:
    return set(_NAME.findall(line))


def _recomputed(loops: list) -> list | None:
    """Copies of ``loops`` where a later loop computes again what it read from an earlier
    loop's per-point array (lanes over outer points would need one such array per lane):
    the lines that define the value, from loads up. None where those read an accumulator."""
    import dataclasses

    out = [dataclasses.replace(loops[0], prologue=list(loops[0].prologue), body=[])]
    definitions: dict[str, tuple[int, str]] = {}  # earlier loops' values -> (order, line)
    for i, loop in enumerate(loops):
        body: list[str] = []
        defined: set[str] = set()
        for line in loop.body:
            m = _PER_POINT_READ.match(line)
            if m is None:
                body.append(line)
                continue
            needed = _defining_lines(m["home"], definitions)
            if needed is None:
                return None
            for name, definition in needed:
                if name not in defined:
                    defined.add(name)
                    body.append(definition)
            body.append(f"const {m['type']} {m['name']} = {m['home']};")
        body = [ln for ln in body if not _PER_POINT_STORE.match(ln)]
        for line in body:
            if d := _DEFINITION.match(line):
                definitions.setdefault(d["name"], (len(definitions), line))
        if i == 0:
            out[0].body = body
            out[0].prologue = [ln for ln in out[0].prologue if not _PER_POINT_ARRAY.search(ln)]
        else:
            prologue = [ln for ln in loop.prologue if not _PER_POINT_ARRAY.search(ln)]
            out.append(dataclasses.replace(loop, prologue=prologue, body=body))
    return out


def _defining_lines(name: str, definitions: dict) -> list[tuple[str, str]] | None:
    """``(name, line)`` of the lines that compute ``name`` from what the loops load, in
    their order; None where one reads an accumulator."""
    found: dict[str, tuple[int, str]] = {}
    pending = [name]
    while pending:
        current = pending.pop()
        if current in found or current not in definitions:
            continue
        found[current] = definitions[current]
        operands = _names(_DEFINITION.match(definitions[current][1])["rhs"])
        if any(op.startswith("acc") for op in operands):
            return None
        pending += operands
    return [(n, line) for n, (_, line) in sorted(found.items(), key=lambda kv: kv[1][0])]


def _kept(segments: list[list[str]], loops: list) -> dict[str, str]:
    """The values a segment defines that a later loop or segment reads, and their types."""
    kept = {}
    for i, segment in enumerate(segments):
        later = [ln for lp in loops[i:] for ln in lp.body]
        later += [ln for seg in segments[i + 1 :] for ln in seg]
        read = set().union(*map(_names, later)) if later else set()
        for line in segment:
            if (m := _DEFINITION.match(line)) and m["name"] in read:
                kept[m["name"]] = m["type"]
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
    # the loop body's update lines that become a lane's (a Welford's)
    updates: dict[str, str] = field(default_factory=dict)
    # after the reduction loops, before the reads (a Welford's last rows folded in)
    done: list[str] = field(default_factory=list)
    # after the reads: the accumulators that are references to others (one var_mean)
    aliases: list[str] = field(default_factory=list)

    def body(self, body: list[str]) -> list[str]:
        """The simd loop's lines for the reduction loop's ``body``."""
        return [*self.bind, *(self.updates.get(line, line) for line in body)]

    def read_lines(self) -> list[str]:
        """Each accumulator defined as its lane's value, then the references to them."""
        lines = []
        for acc, value in self.read.items():
            const = "" if WELFORD.match(f"{self.types[acc]} {acc};") else "const "
            lines.append(f"{const}{self.types[acc]} {acc} = {value};")
        return lines + self.aliases


def column_accumulators(loop, lanes: int, x: str, rows: str) -> ColumnLanes:
    """The lanes of ``loop``'s accumulators (a :class:`~kiln_cpp.handler.ReductionLoop`
    whose prologue declares them all): an array of ``lanes`` values each, a
    ``kiln::WelfordColumns`` for a Welford (each lane one output, all counting the rows),
    or, for a long float sum, a cascade whose blocks are the ``rows`` (C++) steps of the
    reduction loops."""
    cascades = {a.acc: a.lane_type for a in loop.reductions if a.cascade}
    values = {a.acc: a.value for a in loop.reductions}
    lane = f"{x} - {x}_block"
    out = ColumnLanes([], [], [], [], {}, {})
    for line in loop.prologue:
        if m := WELFORD_REFERENCE.match(line):
            out.aliases.append(line)
            continue
        if m := WELFORD.match(line):
            acc = m["acc"]
            out.types[acc] = m["type"]
            out.declare.append(f"kiln::WelfordColumns<{lanes}, {m['vt']}> {acc}_lanes;")
            out.row_start.append(f"{acc}_lanes.next_block();")
            out.done.append(f"{acc}_lanes.fold();")
            out.updates[f"{acc}.update({values[acc]});"] = (
                f"{acc}_lanes.update({lane}, {values[acc]});"
            )
            out.read[acc] = f"{acc}_lanes.lane({lane})"
            continue
        m = ACCUMULATOR.match(line)
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


def kept_binds(passes: ColumnPasses, lines: list[str], kept: str) -> list[str]:
    """The kept values ``lines`` read, each bound to its place ``kept`` (a format of
    ``name``: the value's array at the current point)."""
    read = set().union(*map(_names, lines)) if lines else set()
    defined = {m["name"] for ln in lines if (m := _DEFINITION.match(ln))}
    return [
        f"const {t} {name} = {kept.format(name=name)};"
        for name, t in passes.kept.items()
        if name in read and name not in defined
    ]


def kept_stores(passes: ColumnPasses, segment: list[str], kept: str) -> list[str]:
    """The lines that keep the values ``segment`` defines for later passes."""
    defined = [m["name"] for ln in segment if (m := _DEFINITION.match(ln))]
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
        pragma = [f"{ind}#pragma omp simd"] if simd and simd_safe(body) else []
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
        body = (accs.read_lines() if i == 1 else []) + segment
        body = [*kept_binds(passes, body, kept), *body, *kept_stores(passes, segment, kept)]
        if body:
            lines += over_points(body, simd=True)
        if i == len(passes.loops):
            break
        loop = passes.loops[i]
        body = accs.body(loop.body) if i == 0 else loop.body
        lines += [
            *[ind + line for line in reduction_loops],
            f"{ind}{{",
            *[ind * 2 + line for line in (accs.row_start if i == 0 else [])],
            f"{ind * 2}#pragma omp simd",
            f"{ind * 2}{points}",
            f"{ind * 2}{{",
            *[ind * 3 + line for line in kept_binds(passes, body, kept) + body],
            f"{ind * 2}}}",
            *[ind * 2 + line for line in (accs.next_row if i == 0 else [])],
            f"{ind}}}",
            *[ind + line for line in (accs.done if i == 0 else [])],
        ]
    return [*lines, "}"]
