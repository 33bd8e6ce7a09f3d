"""Passes over the reduction loops of a kernel body, before it is rendered: loops that
do not depend on each other fused into one pass over the data, a value fused loops compute
twice computed once, per-point arrays that fusing made values dropped, and a costly value a
later loop computes again kept per point by the first (softmax's ``exp(x - max)``).

They decide on the statements' fields (:mod:`kiln_cpp.statements`): the names each
defines and reads, never the C++ text.
"""

from __future__ import annotations

from dataclasses import replace

from kiln_cpp.dtypes import value_type
from kiln_cpp.statements import (
    Accumulation,
    Declare,
    Define,
    Element,
    PointArray,
    PointWrite,
    ReductionLoop,
    Statement,
    names,
    point_read,
)


def merge_independent_loops(items: list) -> list:
    """Fuse a reduction loop into the one before it when nothing it computes reads that
    loop's results (``var_mean``'s Welford mean and m2, the mean and variance of a layer
    norm): one pass over the data instead of two. The outer statements between the two,
    which only read the first loop's results, move after the fused loop."""
    out = list(items)
    i = 0
    while i < len(out):
        first = out[i]
        j = i + 1
        while j < len(out) and not isinstance(out[j], ReductionLoop):
            j += 1
        if not isinstance(first, ReductionLoop) or j == len(out):
            i += 1
            continue
        second = out[j]
        between = out[i + 1 : j]
        produced = {a.acc for a in first.reductions}
        produced |= {n for s in first.prologue for n in names(s)}
        produced |= {s.name for s in first.body + between if isinstance(s, Define)}
        # a spill of the first loop read back at the same point is its value: no dependence
        readable = {f"{name}_spill" for name in _spilled(first)}
        used = {
            n
            for s in second.prologue + second.body
            if not _reads_spill(s, readable)
            for n in names(s)
        }
        if used & produced:
            i += 1
            continue
        prologue, body, reductions = _without_repeats(first, second)
        merged = ReductionLoop(
            first.id, first.prologue + prologue, first.body + body, True, reductions
        )
        out[i : j + 1] = [merged, *between]
    return _without_dead_spills(out)


# per-point arrays up to this many elements live on the stack instead of the heap
STACK_SPILL_MAX = 4096


def _on_stack(statement: Statement) -> Statement:
    if not isinstance(statement, PointArray) or statement.kind != "spill":
        return statement
    if not statement.size.isdigit() or int(statement.size) > STACK_SPILL_MAX:
        return statement
    return replace(statement, on_stack=True)


def _without_dead_spills(items: list) -> list:
    """Drop the per-point arrays that no loop reads any more (fusing made them values)."""
    loops = [item for item in items if isinstance(item, ReductionLoop)]
    statements = [s for item in items for s in (item.body if item in loops else [item])]
    for loop in loops:
        loop.prologue = [_on_stack(s) for s in loop.prologue]
        for name in _spilled(loop):
            spill = f"{name}_spill"
            reads = [s for s in statements if spill in s.reads and not isinstance(s, PointWrite)]
            if not reads:
                # an array on the stack stays declared (unused: the compiler drops it)
                loop.prologue = [
                    s
                    for s in loop.prologue
                    if not (isinstance(s, PointArray) and s.name == spill and not s.on_stack)
                ]
                loop.body = [
                    s for s in loop.body if not (isinstance(s, PointWrite) and s.array == spill)
                ]
    return items


def _spilled(loop) -> dict[str, str]:
    """The values ``loop`` spills per point: name -> the index it is stored at."""
    return {
        s.home: s.index
        for s in loop.body
        if isinstance(s, PointWrite) and s.kind == "spill" and s.value == s.home
    }


def _reads_spill(statement: Statement, spills: set[str]) -> bool:
    return (
        isinstance(statement, Define)
        and statement.element is not None
        and statement.element.array in spills
    )


def _without_repeats(first, second) -> tuple[list, list, list[Accumulation]]:
    """``second``'s prologue, body and reductions once fused after ``first``: a value
    ``first`` already computes is reused, and a Welford accumulator of the same value as
    one of ``first``'s becomes a reference to it (the mean and m2 of one ``var_mean``)."""
    computed = {}
    for s in first.body:
        if isinstance(s, Define):
            computed[s.key] = s.name
    types = {name: key[0] for key, name in computed.items()}
    for name, index in _spilled(first).items():
        if name in types:  # the spill read back at the same point is the value itself
            computed[(types[name], point_read(f"{name}_spill", index))] = name
    rename: dict[str, str] = {}
    body = []
    for s in second.body:
        s = s.renamed(rename)
        if isinstance(s, Define) and s.key in computed:
            rename[s.name] = computed[s.key]
            continue
        body.append(s)
    prologue = list(second.prologue)
    reductions = list(first.reductions)
    for a in second.reductions:
        value = rename.get(a.value, a.value)
        update = [u.renamed(rename) for u in a.update]
        twin = next(
            (
                b
                for b in first.reductions
                if a.kind.startswith("welford")
                and b.kind.startswith("welford")
                and (b.value, b.dtype) == (value, a.dtype)
            ),
            None,
        )
        declaration = Declare(a.acc, f"kiln::Welford<{value_type(a.dtype)}>")
        if twin is None or declaration not in prologue:
            reductions.append(replace(a, value=value, update=update))
            continue
        prologue[prologue.index(declaration)] = replace(declaration, twin=twin.acc)
        body = [s for s in body if s not in update]
    return prologue, body, reductions


def reuse_across_loops(items: list, rlinear: str, rnumel: str) -> list:
    """A value a later reduction loop computes again (softmax's ``exp(x - max)``, once
    for the sum and once for the output) is stored per point by the first loop and read
    back by the later one, when what it saves includes a call or a division."""
    loops = [item for item in items if isinstance(item, ReductionLoop)]
    available: dict[tuple, tuple[ReductionLoop, str]] = {}
    stored: set[str] = set()
    for loop in loops:
        alias: dict[str, tuple[ReductionLoop, str]] = {}
        costly: set[str] = set()
        canonical: dict[str, tuple] = {}  # each value's key in the names of its first loop
        definitions = [s for s in loop.body if isinstance(s, Define)]
        for d in definitions:
            key = (d.ctype, d.expr.renamed({n: home[1] for n, home in alias.items()}))
            canonical[d.name] = key
            if key in available:
                alias[d.name] = available[key]
                if d.costly or set(d.reads) & costly:
                    costly.add(d.name)
        needed = set()
        for s in loop.body:
            if not (isinstance(s, Define) and s.name in alias):
                needed |= names(s) & costly
        for i, s in enumerate(loop.body):
            if not isinstance(s, Define) or s.name not in needed:
                continue
            home, name = alias[s.name]
            if name not in stored:
                stored.add(name)
                on_stack = rnumel.isdigit() and int(rnumel) <= STACK_SPILL_MAX
                home.prologue.append(PointArray(name, "xs", s.ctype, rnumel, on_stack))
                home.body.append(PointWrite(name, "xs", rlinear, name))
            array = f"{name}_xs"
            read = Element(array, rlinear, name)
            loop.body[i] = Define(s.name, s.ctype, point_read(array, rlinear), read)
        for d in loop.body:
            if isinstance(d, Define) and d.name not in alias and d.name in canonical:
                available.setdefault(canonical[d.name], (loop, d.name))
    return items
