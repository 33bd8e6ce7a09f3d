"""Vectorising the innermost loop of a kernel with ``#pragma omp simd``.

The handler renders every op as scalar C++; this module turns the loops around that body
into loops the compiler vectorises (``-O3 -fopenmp`` with ``-fno-trapping-math`` lets it
if-convert the selects that NaN-propagating ops need):

- a pointwise kernel's last outer loop, and every loop over the innermost reduction range,
  get ``#pragma omp simd``: the lanes run consecutive points of the contiguous dimension,
  the tail is masked by the compiler;
- reductions go across the lanes with ``reduction(...)`` clauses (each lane keeps its own
  accumulator, combined after the loop). ``max``/``min`` of floats also OR a per-lane NaN
  flag, since the clause's combine drops NaNs that ``kiln::max_float`` propagates;
- Welford accumulators have no clause: their loop is strip-mined into blocks of
  :data:`LANES` points whose lanes update a ``kiln::WelfordLanes`` (one mean and m2 per
  lane, one count for all), with a scalar tail; the lanes are merged into the scalar
  accumulator after the loop (Chan's formula);
- a float sum (``Accumulation.lane_type``) is strip-mined the same way into an array of
  :data:`LANES` partial sums in its value type, added pairwise after the loop (a tree of
  vector adds: a ``reduction(+:...)`` clause combines its lanes one after the other, which
  cost half the time of a 64-point dot product per output); a long one
  (``Accumulation.cascade``) adds its lanes in a ``kiln::CascadeLanes``, the levels of
  eager's cascade sum, so that it stays as accurate as eager's without adding in double;
- a reduction along a strided dimension whose last outer dimension is contiguous (a column
  sum) runs the lanes over outer points instead (:mod:`kiln_cpp.columns`);
- ``argmax``/``argmin``, and bodies that write through an indirect index (the
  out-of-range flag) or scatter, stay scalar.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import sympy
import torch

from kiln_cpp.dtypes import value_type
from kiln_cpp.printer import cexpr
from kiln_loopir.ops import TraceHandler
from kiln_loopir.symbols import index_vars

# lanes of a strip-mined Welford loop: four AVX2 vectors of floats, enough independent
# update chains to hide their latency (8 lanes ran 2.5x slower on var_mean of 1024 x 1024)
LANES = 32

_CLAUSE = {
    "sum": "+", "dot": "+", "prod": "*", "max": "max", "min": "min", "any": "||", "all": "&&",
}  # fmt: skip
_BOOL_CLAUSE = {"sum": "||", "prod": "&&", "max": "||", "min": "&&", "any": "||", "all": "&&"}


@dataclass
class Accumulation:
    """One reduction of a :class:`~kiln_cpp.handler.ReductionLoop`: its accumulator
    ``acc``, the value it reduces and the scalar ``update`` lines the handler put in the
    loop body."""

    kind: str
    acc: str
    value: str
    dtype: torch.dtype
    update: list[str]
    # a sum accumulated in this C++ type, which may add in lanes (see ``reduction_loop``)
    lane_type: str | None = None
    # a long sum: its lanes add in a cascade (``kiln::CascadeLanes``), as eager's
    cascade: bool = False


_OOB_STORE = re.compile(
    r"^if \((?P<cond>.+)\) __atomic_store_n\(&kiln_oob, 1, __ATOMIC_RELAXED\);$"
)
OOB_STORE = "if ({flag}) __atomic_store_n(&kiln_oob, 1, __ATOMIC_RELAXED);"


def flag_lanes(body: list[str], flag: str) -> list[str] | None:
    """``body`` with its out-of-range stores (atomic, which a simd loop may not hold) as
    ORs into ``flag``, a ``reduction(|:flag)`` variable of the loop; None when some other
    line touches the kernel's flag."""
    out = []
    for line in body:
        if m := _OOB_STORE.match(line):
            out.append(f"{flag} |= ({m['cond']});")
        elif "kiln_oob" in line:
            return None
        else:
            out.append(line)
    return out


def simd_safe(body: list[str]) -> bool:
    return flag_lanes(body, "kiln_oob") is not None


def simd_pragma(accs: list[Accumulation]) -> tuple[str, list[str], list[str]] | None:
    """``(pragma, extra body lines, epilogue lines)`` for a loop holding ``accs``, or
    None when one of them cannot be reduced across lanes by a clause."""
    clauses, extra, epilogue = [], [], []
    for a in accs:
        if a.kind.startswith("welford") or a.lane_type:
            continue  # strip-mined, see ``reduction_loop``
        table = _BOOL_CLAUSE if a.dtype == torch.bool else _CLAUSE
        op = table.get(a.kind)
        if op is None:
            return None
        clauses.append(f"reduction({op}:{a.acc})")
        if a.kind in ("max", "min") and a.dtype.is_floating_point:
            clauses.append(f"reduction(|:{a.acc}_nan)")  # an int: a bool flag is slower
            extra.append(f"{a.acc}_nan |= ({a.value} != {a.value});")
            epilogue.append(f"if ({a.acc}_nan) {a.acc} = NAN;")
    pragma = " ".join(["#pragma omp simd", *clauses])
    return pragma, extra, epilogue


_IDENTIFIER = re.compile(r"\b(?:tmp|acc)\d+\w*")
_DEFINED = re.compile(r"^const [\w:<>]+ (tmp\d+) = ")


def merge_independent_loops(items: list) -> list:
    """Fuse a reduction loop into the one before it when nothing it computes reads that
    loop's results (``var_mean``'s Welford mean and m2, the mean and variance of a layer
    norm): one pass over the data instead of two. The outer lines between the two, which
    only read the first loop's results, move after the fused loop."""
    from kiln_cpp.handler import ReductionLoop  # the handler imports this module

    out = list(items)
    i = 0
    while i < len(out):
        first = out[i]
        j = i + 1
        while j < len(out) and isinstance(out[j], str):
            j += 1
        if not isinstance(first, ReductionLoop) or j == len(out):
            i += 1
            continue
        second = out[j]
        between = out[i + 1 : j]
        produced = {a.acc for a in first.reductions}
        produced |= {m.group(0) for line in first.prologue for m in _IDENTIFIER.finditer(line)}
        produced |= {m.group(1) for line in first.body + between if (m := _DEFINED.match(line))}
        # a spill of the first loop read back at the same point is its value: no dependence
        readable = {f"{name}_spill" for name in _spilled(first)}
        used = {
            m.group(0)
            for line in second.prologue + second.body
            if not _reads_spill(line, readable)
            for m in _IDENTIFIER.finditer(line)
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


_SPILL_DECLARATION = re.compile(
    r"^std::vector<(?P<type>[\w:]+)> (?P<name>tmp\d+_spill)\((?P<size>\d+)\);$"
)
# per-point arrays up to this many elements live on the stack instead of the heap
STACK_SPILL_MAX = 4096


def _on_stack(line: str) -> str:
    m = _SPILL_DECLARATION.match(line)
    if m is None or int(m["size"]) > STACK_SPILL_MAX:
        return line
    return f"alignas(64) {m['type']} {m['name']}[{m['size']}];"


def _without_dead_spills(items: list) -> list:
    """Drop the per-point arrays that no loop reads any more (fusing made them values)."""
    from kiln_cpp.handler import ReductionLoop

    loops = [item for item in items if isinstance(item, ReductionLoop)]
    lines = [line for item in items for line in (item.body if item in loops else [item])]
    for loop in loops:
        loop.prologue = [_on_stack(line) for line in loop.prologue]
        for name in _spilled(loop):
            spill = f"{name}_spill"
            reads = [ln for ln in lines if f"{spill}[" in ln and not _SPILL_WRITE.match(ln)]
            if not reads:
                loop.prologue = [ln for ln in loop.prologue if f" {spill}(" not in ln]
                loop.body = [ln for ln in loop.body if not ln.startswith(f"{spill}[")]
    return items


_SPILL_WRITE = re.compile(r"^(?P<name>tmp\d+)_spill\[(?P<index>.+)\] = (?P=name);$")


def _spilled(loop) -> dict[str, str]:
    """The values ``loop`` spills per point: name -> the index it is stored at."""
    return {m["name"]: m["index"] for line in loop.body if (m := _SPILL_WRITE.match(line))}


def _reads_spill(line: str, spills: set[str]) -> bool:
    m = _DEFINITION.match(line)
    return bool(m) and any(m["rhs"].startswith(f"{spill}[") for spill in spills)


_DEFINITION = re.compile(r"^const (?P<type>[\w:<>]+) (?P<name>tmp\d+) = (?P<rhs>.+);$")


def _without_repeats(first, second) -> tuple[list[str], list[str], list[Accumulation]]:
    """``second``'s prologue, body and reductions once fused after ``first``: a value
    ``first`` already computes is reused, and a Welford accumulator of the same value as
    one of ``first``'s becomes a reference to it (the mean and m2 of one ``var_mean``)."""
    computed = {}
    for line in first.body:
        if m := _DEFINITION.match(line):
            computed[(m["type"], m["rhs"])] = m["name"]
    types = {name: key[0] for key, name in computed.items()}
    for name, index in _spilled(first).items():
        if name in types:  # the spill read back at the same point is the value itself
            computed[(types[name], f"{name}_spill[{index}]")] = name
    rename: dict[str, str] = {}

    def renamed(text: str) -> str:
        return _IDENTIFIER.sub(lambda m: rename.get(m.group(0), m.group(0)), text)

    body = []
    for line in second.body:
        line = renamed(line)
        m = _DEFINITION.match(line)
        if m and (m["type"], m["rhs"]) in computed:
            rename[m["name"]] = computed[(m["type"], m["rhs"])]
            continue
        body.append(line)
    prologue = list(second.prologue)
    reductions = list(first.reductions)
    for a in second.reductions:
        value, update = renamed(a.value), [renamed(u) for u in a.update]
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
        declaration = f"kiln::Welford<{value_type(a.dtype)}> {a.acc};"
        if twin is None or declaration not in prologue:
            reductions.append(dataclasses.replace(a, value=value, update=update))
            continue
        prologue[prologue.index(declaration)] = (
            f"kiln::Welford<{value_type(a.dtype)}>& {a.acc} = {twin.acc};"
        )
        body = [line for line in body if line not in update]
    return prologue, body, reductions


def simd_body(body: list[str], accs: list[Accumulation]) -> list[str]:
    """The body for the lanes: a float ``max``/``min`` update becomes a plain compare (a
    vector max), since the NaN flag already carries what ``kiln::max_float`` propagates."""
    plain = {}
    for a in accs:
        if a.kind in ("max", "min") and a.dtype.is_floating_point and len(a.update) == 1:
            cmp = ">" if a.kind == "max" else "<"
            plain[a.update[0]] = f"{a.acc} = {a.value} {cmp} {a.acc} ? {a.value} : {a.acc};"
    return [plain.get(line, line) for line in body]


def nan_flags(accs: list[Accumulation]) -> list[str]:
    return [
        f"int {a.acc}_nan = 0;"
        for a in accs
        if a.kind in ("max", "min") and a.dtype.is_floating_point
    ]


def reduction_loop(
    loops: list[str],
    last_var: str,
    last_range: str,
    prologue: list[str],
    body: list[str],
    accs: list[Accumulation],
    ind: str,
    flag: str,
    first: str = "0",
    points: str = "0",
) -> list[str]:
    """The lines of one loop over the reduction ranges: ``loops`` are the ``for`` headers
    (the last one over ``first`` <= ``last_var`` < ``last_range``), ``body`` the handler's
    scalar body; ``flag`` names the loop's own out-of-range flag; ``points`` is about how
    many points the loops run (C++: a cascade's steps between levels follow it)."""
    lanes_body = flag_lanes(body, flag)
    plan = simd_pragma(accs) if loops and lanes_body is not None else None
    if plan is None or lanes_body is None:
        return [*prologue, *loops, "{", *[ind + line for line in body], "}"]
    pragma, extra, epilogue = plan
    welfords = [a for a in accs if a.kind.startswith("welford")]
    sums = [a for a in accs if a.lane_type]
    head = [*prologue, *nan_flags(accs)]
    if lanes_body != body:
        head.append(f"int {flag} = 0;")
        pragma += f" reduction(|:{flag})"
        epilogue = [*epilogue, OOB_STORE.format(flag=flag)]
    if _shorter_than_a_block(last_range, first):  # no block would run: no lanes
        if welfords:
            return [*prologue, *loops, "{", *[ind + line for line in body], "}"]
        pragma = " ".join([pragma, *(f"reduction(+:{a.acc})" for a in sums)])
        sums = []
    if not welfords and not sums:
        lines = [*loops[:-1], pragma, loops[-1], "{"]
        lines += [ind + line for line in simd_body(lanes_body, accs) + extra]
        return [*head, *lines, "}", *epilogue]
    # strip-mined: blocks of LANES points update the lanes, a scalar tail the accumulator
    lanes = {a.acc: f"{a.acc}_lanes" for a in welfords + sums}
    head += [
        f"kiln::WelfordLanes<{LANES}, {value_type(a.dtype)}> {lanes[a.acc]};" for a in welfords
    ]
    cascades = [a for a in sums if a.cascade]
    head += [
        f"kiln::CascadeLanes<{LANES}, {a.lane_type}> {lanes[a.acc]}(({points}) / {LANES});"
        if a.cascade
        else f"{a.lane_type} {lanes[a.acc]}[{LANES}] = {{}};"
        for a in sums
    ]
    updates = {line: a for a in welfords + sums for line in a.update}
    lane = f"{last_var} - {last_var}_block"

    def lane_update(a: Accumulation) -> str:
        if a.cascade:
            return f"{lanes[a.acc]}.level[0][{lane}] += {a.value};"
        if a.lane_type:
            return f"{lanes[a.acc]}[{lane}] += {a.value};"
        return f"{lanes[a.acc]}.update({lane}, {a.value});"

    lane_body = [
        lane_update(updates[line]) if line in updates else line
        for line in simd_body(lanes_body, accs)
    ]
    main_end = f"{last_var}_main"
    whole_blocks = f"({last_range}) / {LANES} * {LANES}"
    if first != "0":  # a chunk of the loop (see kiln_cpp.split)
        whole_blocks = f"{first} + ({last_range} - {first}) / {LANES} * {LANES}"
    outer = loops[:-1]
    lines = [*outer, "{"] if outer else ["{"]
    lines += [
        f"{ind}const int64_t {main_end} = {whole_blocks};",
        f"{ind}for (int64_t {last_var}_block = {first}; {last_var}_block < {main_end}; "
        f"{last_var}_block += {LANES})",
        f"{ind}{{",
        *[f"{ind * 2}{lanes[a.acc]}.next_block();" for a in welfords],
        f"{ind * 2}{pragma}",
        f"{ind * 2}for (int64_t {last_var} = {last_var}_block; {last_var} < "
        f"{last_var}_block + {LANES}; ++{last_var})",
        f"{ind * 2}{{",
        *[ind * 3 + line for line in lane_body + extra],
        f"{ind * 2}}}",
        *[f"{ind * 2}{lanes[a.acc]}.next_block();" for a in cascades],
        f"{ind}}}",
        f"{ind}for (int64_t {last_var} = {main_end}; {last_var} < {last_range}; ++{last_var})",
        f"{ind}{{",
        *[ind * 2 + line for line in body],
        f"{ind}}}",
        "}",
    ]
    merge = [f"{a.acc}.merge({lanes[a.acc]});" for a in welfords]
    for a in sums:
        if a.cascade:
            merge.append(f"{a.acc} += {lanes[a.acc]}.total();")
            continue
        merge += pairwise_sum(lanes[a.acc], LANES)
        merge.append(f"{a.acc} += {lanes[a.acc]}[0];")
    return [*head, *lines, *merge, *epilogue]


def _shorter_than_a_block(last_range: str, first: str) -> bool:
    """Whether the innermost reduction loop runs fewer than :data:`LANES` points, a number
    known now: strip-mined, its blocks would never run and the lanes (an array to clear, a
    tree of adds, a merge) would cost more than its points. It runs as one ``omp simd``
    loop with a clause instead (a Welford loop: scalar)."""
    return first == "0" and last_range.isdigit() and int(last_range) < LANES


def pairwise_sum(array: str, size: int) -> list[str]:
    """Lines that add the ``size`` (a power of two) partial sums of ``array`` into its first
    element pairwise: each step one vector add of the upper half into the lower."""
    lines = []
    width = size // 2
    while width:
        lines += [
            "#pragma omp simd",
            f"for (int kiln_l = 0; kiln_l < {width}; ++kiln_l) "
            f"{array}[kiln_l] += {array}[kiln_l + {width}];",
        ]
        width //= 2
    return lines


ACCUMULATOR = re.compile(r"^(?P<type>[\w:<>]+) (?P<acc>acc\d+) = (?P<init>.+);$")


def coefficient(index: sympy.Expr, var: sympy.Symbol) -> sympy.Expr:
    return sympy.expand(index).coeff(var)


# points per side of a tile of a transposing pointwise kernel (on a 1024 x 1024 transpose +
# add, one thread: 32 beat 8, 16 and 64 before gathers were enabled; with them 64 took
# 0.99-1.06 ms against 1.12-1.30 ms for 32, best of 25 runs each, turn about)
TILE = 64


def _unit_stride_counts(kernel) -> tuple[int, int, bool]:
    """For the last two outer dimensions ``a`` and ``b``: how many loads and stores step
    by one element along each, and whether any access steps by one along ``a`` while
    moving along ``b`` too (a transposing access)."""
    handler = TraceHandler()
    stores = kernel.body(handler)
    indices = [ld.index for ld in handler.loads]
    indices += [stores[name] for name in kernel.stored_buffers() if name in stores]
    *_, x_a, x_b = index_vars(len(kernel.ranges))
    along_a = sum(coefficient(i, x_a) == 1 for i in indices)
    along_b = sum(coefficient(i, x_b) == 1 for i in indices)
    crossing = any(coefficient(i, x_a) == 1 and coefficient(i, x_b) != 0 for i in indices)
    return along_a, along_b, crossing


def transposing(kernel) -> str | None:
    """For a pointwise kernel that reads or writes some buffer along its second-to-last
    dimension (``x.t() + y``), the dimension to vectorise: ``"a"`` (second-to-last) when
    more accesses are contiguous along it, else ``"b"`` (last); None for other kernels."""
    if len(kernel.ranges) < 2 or kernel.reduction_ranges:
        return None
    along_a, along_b, crossing = _unit_stride_counts(kernel)
    if not crossing:
        return None
    return "a" if along_a > along_b else "b"


def tiled_loops(ranges: list[str], when: str, inner: str) -> list[str]:
    """The loop headers of a pointwise kernel run in :data:`TILE` x :data:`TILE` tiles of
    its last two dimensions ``a`` and ``b``: the tiles in parallel, the ``inner`` one of
    the two vectorised."""
    n = len(ranges)
    a, b = f"x{n - 2}", f"x{n - 1}"
    size = {a: ranges[-2], b: ranges[-1]}
    lines = [f"#pragma omp parallel for collapse({n}) if({when})"]
    lines += [f"for (int64_t x{i} = 0; x{i} < {r}; ++x{i})" for i, r in enumerate(ranges[:-2])]
    lines += [
        f"for (int64_t {v}_tile = 0; {v}_tile < {size[v]}; {v}_tile += {TILE})" for v in (a, b)
    ]
    first, second = (b, a) if inner == "a" else (a, b)
    for v in (first, second):
        if v == second:
            lines.append("#pragma omp simd")
        lines.append(
            f"for (int64_t {v} = {v}_tile; {v} < std::min<int64_t>({v}_tile + {TILE}, "
            f"{size[v]}); ++{v})"
        )
    return lines


def _transposed_loads(kernel, inner: str) -> list[tuple[str, str]]:
    """``(buffer, index text)`` of each load that steps by one element along the tile's
    other dimension while moving along the vectorised one."""
    *_, x_a, x_b = index_vars(len(kernel.ranges))
    x_in, x_out = (x_a, x_b) if inner == "a" else (x_b, x_a)
    found = []
    for ld in kernel.trace().loads:
        if coefficient(ld.index, x_out) == 1 and coefficient(ld.index, x_in) != 0:
            item = (ld.buffer, cexpr(sympy.expand(ld.index)))
            if item not in found:
                found.append(item)
    return found


def tiled_kernel_lines(
    kernel, body: list[str], ranges: list[str], when: str, inner: str, ind: str
) -> list[str]:
    """A transposing pointwise kernel in tiles (see :func:`tiled_loops`). A load that is
    contiguous along the other dimension of the tile is first copied into a tile-sized
    array with contiguous reads, transposed, so the vectorised loop reads it contiguously
    too (on a 1024 x 1024 ``a.t() + b`` the gathers it replaces were 2.5x slower)."""
    loops = tiled_loops(ranges, when, inner)
    n = len(ranges)
    a, b = f"x{n - 2}", f"x{n - 1}"
    v_in, v_out = (a, b) if inner == "a" else (b, a)
    size = {a: ranges[-2], b: ranges[-1]}
    tile_loop = {
        v: f"for (int64_t {v} = {v}_tile; {v} < std::min<int64_t>({v}_tile + {TILE}, "
        f"{size[v]}); ++{v})"
        for v in (a, b)
    }
    copies, body = [], list(body)
    for k, (buffer, index) in enumerate(_transposed_loads(kernel, inner)):
        element = f"{buffer}[{index}]"
        uses = [i for i, line in enumerate(body) if line.endswith(f" = {element};")]
        if not uses:
            continue  # a converted or masked load: read in place
        local = f"{buffer}_tile{k}"
        element_type = kernel_types(kernel)[buffer]
        copies.append(f"{element_type} {local}[{TILE}][{TILE}];")
        if all(size[v].isdigit() and int(size[v]) % TILE == 0 for v in (a, b)):
            copies += _blocked_transpose(local, element, element_type, v_in, v_out, ind)
        else:
            copies += [
                tile_loop[v_in],
                "#pragma omp simd",
                tile_loop[v_out],
                f"{ind}{local}[{v_out} - {v_out}_tile][{v_in} - {v_in}_tile] = {element};",
            ]
        for i in uses:
            body[i] = body[i].replace(
                f" = {element};", f" = {local}[{v_out} - {v_out}_tile][{v_in} - {v_in}_tile];"
            )
    head, intra = loops[:-3], loops[-3:]  # the tile loops, then the loops in a tile
    return [
        *head,
        "{",
        *[ind + line for line in copies],
        *[ind + line for line in intra],
        ind + "{",
        *[ind * 2 + line for line in body],
        ind + "}",
        "}",
    ]


# points per side of the blocks a whole tile is transposed in
BLOCK = 8


def _blocked_transpose(
    local: str, element: str, element_type: str, v_in: str, v_out: str, ind: str
) -> list[str]:
    """A whole tile of ``element`` (contiguous along ``v_out``) copied transposed into
    ``local`` in :data:`BLOCK` x :data:`BLOCK` blocks, each read by rows and written by
    columns in fully unrolled loops, which g++ turns into vector loads, shuffles and stores
    (1024 x 1024 ``a.t() + b``, one thread: 0.81 ms against 1.07 ms for the tile copied
    point by point under ``omp simd``, best of 25 runs each)."""
    unroll = f"#pragma GCC unroll {BLOCK}"
    block = f"{local}_block"
    return [
        f"for (int64_t {v_in}_b = {v_in}_tile; {v_in}_b < {v_in}_tile + {TILE}; "
        f"{v_in}_b += {BLOCK})",
        f"for (int64_t {v_out}_b = {v_out}_tile; {v_out}_b < {v_out}_tile + {TILE}; "
        f"{v_out}_b += {BLOCK})",
        "{",
        f"{ind}{element_type} {block}[{BLOCK}][{BLOCK}];",
        f"{ind}{unroll}",
        f"{ind}for (int64_t {v_in} = {v_in}_b; {v_in} < {v_in}_b + {BLOCK}; ++{v_in})",
        f"{ind}{unroll}",
        f"{ind}for (int64_t {v_out} = {v_out}_b; {v_out} < {v_out}_b + {BLOCK}; ++{v_out})",
        f"{ind * 2}{block}[{v_in} - {v_in}_b][{v_out} - {v_out}_b] = {element};",
        f"{ind}{unroll}",
        f"{ind}for (int64_t j = 0; j < {BLOCK}; ++j)",
        f"{ind}{unroll}",
        f"{ind}for (int64_t i = 0; i < {BLOCK}; ++i)",
        f"{ind * 2}{local}[{v_out}_b - {v_out}_tile + j][{v_in}_b - {v_in}_tile + i] = "
        f"{block}[i][j];",
        "}",
    ]


def kernel_types(kernel) -> dict[str, str]:
    from kiln_cpp.dtypes import storage_type

    return {name: storage_type(dtype) for name, dtype in kernel.arg_dtypes.items()}


def _costly(rhs: str) -> bool:
    return "kiln::" in rhs or "std::" in rhs or " / " in rhs


def reuse_across_loops(items: list, rlinear: str, rnumel: str) -> list:
    """A value a later reduction loop computes again (softmax's ``exp(x - max)``, once
    for the sum and once for the output) is stored per point by the first loop and read
    back by the later one, when what it saves includes a call or a division."""
    from kiln_cpp.handler import ReductionLoop

    loops = [item for item in items if isinstance(item, ReductionLoop)]
    available: dict[tuple[str, str], tuple[ReductionLoop, str]] = {}
    stored: set[str] = set()
    for loop in loops:
        alias: dict[str, tuple[ReductionLoop, str]] = {}
        costly: set[str] = set()
        canonical: dict[str, str] = {}  # each line's value in the names of its first loop
        for line in loop.body:
            m = _DEFINITION.match(line)
            if m is None:
                continue
            rhs = _canonical(m["rhs"], alias)
            canonical[m["name"]] = rhs
            if (m["type"], rhs) in available:
                alias[m["name"]] = available[(m["type"], rhs)]
                operands = {n.group(0) for n in _IDENTIFIER.finditer(m["rhs"])}
                if _costly(rhs) or operands & costly:
                    costly.add(m["name"])
        needed = set()
        for line in loop.body:
            m = _DEFINITION.match(line)
            if m is not None and m["name"] in alias:
                continue
            needed |= {n.group(0) for n in _IDENTIFIER.finditer(line)} & costly
        for i, line in enumerate(loop.body):
            m = _DEFINITION.match(line)
            if m is None or m["name"] not in needed:
                continue
            home, name = alias[m["name"]]
            if name not in stored:
                stored.add(name)
                home.prologue.append(_per_point_array(m["type"], f"{name}_xs", rnumel))
                home.body.append(f"{name}_xs[{rlinear}] = {name};")
            loop.body[i] = f"const {m['type']} {m['name']} = {name}_xs[{rlinear}];"
        for line in loop.body:
            m = _DEFINITION.match(line)
            if m is not None and m["name"] not in alias and m["name"] in canonical:
                available.setdefault((m["type"], canonical[m["name"]]), (loop, m["name"]))
    return items


def _canonical(rhs: str, alias: dict) -> str:
    return _IDENTIFIER.sub(
        lambda n: alias[n.group(0)][1] if n.group(0) in alias else n.group(0), rhs
    )


def _per_point_array(element_type: str, name: str, size: str) -> str:
    if size.isdigit() and int(size) <= STACK_SPILL_MAX:
        return f"alignas(64) {element_type} {name}[{size}];"
    return f"std::vector<{element_type}> {name}({size});"
