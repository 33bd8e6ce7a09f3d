"""Vectorising the innermost loop of a kernel with ``#pragma omp simd``.

The handler emits every op as a scalar statement (:mod:`kiln_cpp.statements`); this module
puts loops the compiler vectorises around that body (``-O3 -fopenmp`` with
``-fno-trapping-math`` lets it if-convert the selects that NaN-propagating ops need),
deciding on the statements (which update an accumulator, which check an index) and
rendering them once:

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
- an index check (:class:`~kiln_cpp.statements.CheckIndex`) in the lanes ORs into a
  ``reduction(|:...)`` flag of the loop instead of storing the kernel's flag atomically;
- ``argmax``/``argmin`` and scatters stay scalar.
"""

from __future__ import annotations

from dataclasses import replace

import sympy
import torch

from kiln_cpp.dtypes import value_type
from kiln_cpp.printer import cexpr
from kiln_cpp.statements import (
    Accumulation,
    CheckIndex,
    Define,
    Element,
    Expr,
    Statement,
    Update,
    mark,
    render,
)
from kiln_loopir.ops import TraceHandler
from kiln_loopir.symbols import index_vars

# lanes of a strip-mined Welford loop: four AVX2 vectors of floats, enough independent
# update chains to hide their latency (8 lanes ran 2.5x slower on var_mean of 1024 x 1024)
LANES = 32

_CLAUSE = {
    "sum": "+", "dot": "+", "prod": "*", "max": "max", "min": "min", "any": "||", "all": "&&",
}  # fmt: skip
_BOOL_CLAUSE = {"sum": "||", "prod": "&&", "max": "||", "min": "&&", "any": "||", "all": "&&"}


def flag_lanes(body: list[Statement], flag: str) -> list[Statement]:
    """``body`` with its index checks (atomic stores of the kernel's flag, which a simd loop
    may not hold) as ORs into ``flag``, a ``reduction(|:flag)`` variable of the loop."""
    return [
        replace(s, flag=flag) if isinstance(s, CheckIndex) and s.flag is None else s for s in body
    ]


def checks_indices(body: list) -> bool:
    """Whether ``body`` checks an indirect index (sets the out-of-range flag)."""
    return any(isinstance(s, CheckIndex) for s in body)


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


def simd_body(body: list[Statement], accs: list[Accumulation]) -> list[Statement]:
    """The body for the lanes: a float ``max``/``min`` update becomes a plain compare (a
    vector max), since the NaN flag already carries what ``kiln::max_float`` propagates."""
    plain = {}
    for a in accs:
        if a.kind in ("max", "min") and a.dtype.is_floating_point and len(a.update) == 1:
            cmp = ">" if a.kind == "max" else "<"
            acc, value = mark(a.acc), mark(a.value)
            compare = f"{acc} = {value} {cmp} {acc} ? {value} : {acc};"
            plain[a.update[0]] = Update(a.acc, Expr.of(compare))
    return [plain.get(s, s) for s in body]


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
    prologue: list[Statement],
    body: list[Statement],
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
    scalar = [ind + line for line in render(body)]
    plan = simd_pragma(accs) if loops else None
    if plan is None:
        return [*render(prologue), *loops, "{", *scalar, "}"]
    lanes_body = flag_lanes(body, flag)
    pragma, extra, epilogue = plan
    welfords = [a for a in accs if a.kind.startswith("welford")]
    sums = [a for a in accs if a.lane_type]
    head = [*render(prologue), *nan_flags(accs)]
    if checks_indices(body):
        head.append(f"int {flag} = 0;")
        pragma += f" reduction(|:{flag})"
        epilogue = [*epilogue, CheckIndex(Expr(("", flag, ""))).render()]
    if _shorter_than_a_block(last_range, first):  # no block would run: no lanes
        if welfords:
            return [*render(prologue), *loops, "{", *scalar, "}"]
        pragma = " ".join([pragma, *(f"reduction(+:{a.acc})" for a in sums)])
        sums = []
    if not welfords and not sums:
        lines = [*loops[:-1], pragma, loops[-1], "{"]
        lines += [ind + line for line in render(simd_body(lanes_body, accs)) + extra]
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
    updates = {s: a for a in welfords + sums for s in a.update}
    lane = f"{last_var} - {last_var}_block"

    def lane_update(a: Accumulation) -> str:
        if a.cascade:
            return f"{lanes[a.acc]}.level[0][{lane}] += {a.value};"
        if a.lane_type:
            return f"{lanes[a.acc]}[{lane}] += {a.value};"
        return f"{lanes[a.acc]}.update({lane}, {a.value});"

    lane_body = [
        lane_update(updates[s]) if s in updates else s.render() for s in simd_body(lanes_body, accs)
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
        *[ind + line for line in scalar],
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


def tiled_loops(ranges: list[str], when: str, inner: str, clause: str = "") -> list[str]:
    """The loop headers of a pointwise kernel run in :data:`TILE` x :data:`TILE` tiles of
    its last two dimensions ``a`` and ``b``: the tiles in parallel, the ``inner`` one of
    the two vectorised; ``clause`` ends each pragma."""
    n = len(ranges)
    a, b = f"x{n - 2}", f"x{n - 1}"
    size = {a: ranges[-2], b: ranges[-1]}
    lines = [f"#pragma omp parallel for collapse({n}) if({when}){clause}"]
    lines += [f"for (int64_t x{i} = 0; x{i} < {r}; ++x{i})" for i, r in enumerate(ranges[:-2])]
    lines += [
        f"for (int64_t {v}_tile = 0; {v}_tile < {size[v]}; {v}_tile += {TILE})" for v in (a, b)
    ]
    first, second = (b, a) if inner == "a" else (a, b)
    for v in (first, second):
        if v == second:
            lines.append(f"#pragma omp simd{clause}")
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
    kernel, body: list[Statement], ranges: list[str], when: str, inner: str, ind: str
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
        uses = [
            i
            for i, s in enumerate(body)
            if isinstance(s, Define) and s.element == Element(buffer, index)
        ]
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
        tiled = Expr((f"{local}[{v_out} - {v_out}_tile][{v_in} - {v_in}_tile]",))
        for i in uses:
            body[i] = replace(body[i], expr=tiled, element=None)
    head, intra = loops[:-3], loops[-3:]  # the tile loops, then the loops in a tile
    return [
        *head,
        "{",
        *[ind + line for line in copies],
        *[ind + line for line in intra],
        ind + "{",
        *[ind * 2 + line for line in render(body)],
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
