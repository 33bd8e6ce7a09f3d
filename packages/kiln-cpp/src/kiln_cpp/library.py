"""A graph's library source: each distinct kernel compiled once, in one or several units.

**One body per distinct kernel.** A model of repeated layers renders the same kernel many
times under different names (``kiln_fused_add_layer_norm_3``, ``..._17``) with parameters
named after different buffers, in a different order (they are sorted by name). Two
sources are the same kernel when they are equal once the function's name and its
parameters are renamed by where they are first used in the body (an alpha-renaming over
identifier tokens, the comment lines before the function left out). The first one is
emitted as rendered; each later one becomes a thin ``extern "C"`` function of its own name
and parameters that calls the first with its arguments in the first's order (a tail jump
at ``-O3``), so every name still resolves through ``ctypes`` and the host program.

The comparison reads the rendered text because that is what reaches ``compile`` (from a
fresh render or kiln's on-disk cache alike); renaming whole identifiers is exact, a miss
(two equal kernels whose text differs otherwise) only costs a compile.

**Units.** The host program is the costly part of a big graph's build: one long function
whose every early return releases the tensors it holds, which g++ -O3 takes seconds over
(BERT, 6 layers, training: 5.2 s for the backward's host program, 0.8 s for its kernels).
From :data:`HOST_UNIT_MIN_CHARS` of source it is a translation unit of its own, compiled at
``-Og`` (:data:`kiln_cpp.build.HOST_FLAGS`; it makes calls, the kernels do the work;
the figures below were taken at ``-O1``, 1.8 s there) while the kernels compile
at ``-O3``, at once, then linked into one library (:func:`kiln_cpp.build.build`); the
launch groups go with it. At -O1 a big host program takes a third of the time, a small
one about as long, so below the threshold the two units gain only where a second core is
free. Measured on a 2-core machine shared with another session's work, each library's
build (one unit at -O3 -> two units at once): BERT 2 layers training (host programs of
31 k and 44 k characters) 1.40 -> 0.70 s and 1.55 -> 1.11 s while that work held one
core, 1.31 -> 1.31 s and 1.6-1.7 -> 1.8-2.1 s while it compiled on both; BERT inference
(20.6 k) 0.56 -> 0.70 s (both busy); 5.7 k: 0.32 -> 0.31 s (one free); 3 layers (42 k,
61 k) 2.19 -> 1.01 s and 2.55 -> 1.62 s; 6 layers (74 k, 111 k) 6.43 -> 3.05 s and 6.99
-> 3.84 s. Hence the threshold, between the inference and the training host programs.

The kernels can be split too, into up to :data:`CORES` units (less the host's), one
per :data:`KERNELS_PER_UNIT` distinct kernels, balanced by source size; a kernel's
duplicates stay in its unit, and each unit has the prelude and a declaration of every
function. That is off by default: on the 2-core machine 2 units against one built 114
kernels (174 k characters) in 2.37-2.52 s against 2.44 s, and 165 kernels in 3.99-4.14 s
against 3.88-3.93 s.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_SIGNATURE = re.compile(r'extern "C" int (\w+)\(([^)]*)\)')
_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*")
_PARAM_NAME = re.compile(r"(\w+)\s*$")

# the host program's own unit (compiled at -Og, beside the kernels) from this many
# characters of its source; a smaller one is compiled with the kernels (measured: above)
HOST_UNIT_MIN_CHARS = 24000
# distinct kernels per kernel unit (``$KILN_CPP_KERNELS_PER_UNIT``); 0: one kernel unit
# (measured above: splitting the kernels gained nothing on a 2-core machine)
KERNELS_PER_UNIT = 0
CORES = os.cpu_count() or 1  # compilers run at once, at most


@dataclass
class Function:
    """One ``extern "C"`` function of a source: its name, parameters and dedup key."""

    name: str
    params: list[tuple[str, str]]  # (type, name), in signature order
    key: tuple  # equal for sources that are the same kernel up to names
    order: list[int]  # signature positions in canonical order (first use in the body)


def parse(source: str) -> Function:
    """The source's first ``extern "C" int`` function (ValueError where there is none)."""
    m = _SIGNATURE.search(source)
    if m is None:
        raise ValueError('not a kiln-cpp kernel source: no extern "C" function')
    name = m.group(1)
    params = []
    for p in m.group(2).split(","):
        if p.strip():
            pm = _PARAM_NAME.search(p)
            params.append((p[: pm.start()].strip(), pm.group(1)))
    position = {pname: i for i, (_, pname) in enumerate(params)}
    first_use: dict[int, None] = {}
    canonical = {name: "kiln_dedup_self"}

    def rename(match: re.Match) -> str:
        token = match.group(0)
        if token in position and token not in canonical:
            first_use[position[token]] = None
            canonical[token] = f"kiln_dedup_p{len(first_use) - 1}"
        return canonical.get(token, token)

    body = _IDENTIFIER.sub(rename, source[m.end() :])
    order = list(first_use) + [i for i in range(len(params)) if i not in first_use]
    prefix = [ln for ln in source[: m.start()].splitlines() if not ln.lstrip().startswith("//")]
    key = ("\n".join(prefix), tuple(params[i][0] for i in order), body)
    return Function(name, params, key, order)


def _thunk(dup: Function, first: Function) -> str:
    """``dup`` as a call of ``first``: ``first``'s parameter at canonical place ``c`` gets
    ``dup``'s parameter at canonical place ``c``."""
    place = {pos: c for c, pos in enumerate(first.order)}
    args = [dup.params[dup.order[place[i]]][1] for i in range(len(first.params))]
    params = ", ".join(f"{t} {n}" for t, n in dup.params)
    return (
        f"// {dup.name}: the same kernel as {first.name}\n"
        f'extern "C" int {dup.name}({params}) {{ return {first.name}({", ".join(args)}); }}\n'
    )


def _declaration(fn: Function) -> str:
    return f'extern "C" int {fn.name}({", ".join(f"{t} {n}" for t, n in fn.params)});'


def kernels_per_unit() -> int:
    """:data:`KERNELS_PER_UNIT`, or ``$KILN_CPP_KERNELS_PER_UNIT``."""
    value = os.environ.get("KILN_CPP_KERNELS_PER_UNIT")
    return KERNELS_PER_UNIT if value is None else int(value)


@dataclass
class LibrarySource:
    """The translation units of a library, and what they hold."""

    units: list[str]  # the kernels (compiled with ``build.CXX_FLAGS``)
    host: str | None  # the host program's unit (``build.HOST_FLAGS``), where there is one
    functions: list[Function]  # one per source, in order
    distinct: int  # kernel bodies compiled (the others are thunks)
    duplicates: dict[str, str] = field(default_factory=dict)  # name -> the kernel it calls


def library_source(
    prelude: str, sources: Sequence[str], host: str | None = None, units: int | None = None
) -> LibrarySource:
    """The units of a library of ``sources`` (each an ``extern "C"`` function) and the
    ``host`` program; ``units`` forces the number of kernel units (else see the module)."""
    functions = [parse(s) for s in sources]
    names = {f.name for f in functions}
    first: dict[tuple, int] = {}
    duplicates: dict[str, str] = {}
    # each distinct kernel with its duplicates' thunks after it: what units are made of
    pieces: dict[int, list[str]] = {}
    callers: list[str] = []  # launch groups, which call kernels: after them
    for i, (fn, src) in enumerate(zip(functions, sources, strict=True)):
        if _calls_others(src, fn.name, names):
            callers.append(src)
            continue
        j = first.setdefault(fn.key, i)
        if j != i and fn.name != functions[j].name:
            duplicates[fn.name] = functions[j].name
            pieces[j].append(_thunk(fn, functions[j]))
        else:
            pieces[i] = [src]
    distinct = len(functions) - len(duplicates)
    declarations = "\n".join(_declaration(f) for f in functions) + "\n"
    host_unit, tail = None, host or ""
    if host is not None and len(host) >= HOST_UNIT_MIN_CHARS:
        # with the launch groups, which call kernels as it does
        host_unit, tail = "\n".join([prelude, declarations, *callers]) + host, ""
        callers = []
    if units is None:
        per_unit = kernels_per_unit()
        cores = CORES - (host_unit is not None)
        units = min(cores, len(pieces) // per_unit) if per_unit > 0 else 1
    if units <= 1:
        text = "\n".join([prelude, *(p for i in sorted(pieces) for p in pieces[i]), *callers])
        return LibrarySource([text + tail], host_unit, functions, distinct, duplicates)
    # balanced by size: the largest pieces first, each into the unit holding the least
    held: list[list[int]] = [[] for _ in range(units)]
    sizes = [len(tail) + sum(map(len, callers))] + [0] * (units - 1)
    for i in sorted(pieces, key=lambda i: (-sum(map(len, pieces[i])), i)):
        k = min(range(units), key=lambda k: (sizes[k], k))
        held[k].append(i)
        sizes[k] += sum(map(len, pieces[i]))
    texts = []
    for k, unit in enumerate(held):
        parts = [prelude, declarations, *(p for i in sorted(unit) for p in pieces[i])]
        texts.append("\n".join(parts + callers) + tail if k == 0 else "\n".join(parts))
    return LibrarySource(texts, host_unit, functions, distinct, duplicates)


def _calls_others(source: str, name: str, names: set[str]) -> bool:
    return any(t in names and t != name for t in _IDENTIFIER.findall(source))
