"""A kernel as one ``extern "C"`` C++ function (returning 1 when an indirect index was out of
range): the outer loops (parallel with OpenMP above a size threshold), the reduction loops
inside them, and the body the handler rendered; the innermost loop is vectorised
(:mod:`kiln_cpp.vectorize`), a column reduction's lanes run over outer points
(:mod:`kiln_cpp.columns`). A full or column reduction whose outer loop would leave threads
idle runs its reduction in chunks across threads (:mod:`kiln_cpp.split`). A pointwise kernel
whose body compares a loop variable with constants (``cat``, padding) runs as one loop nest
per piece of that loop, each rendered with the comparisons decided
(:mod:`kiln_cpp.index_facts`)."""

from __future__ import annotations

import math

import sympy

from kiln_cpp.columns import column_passes, column_reduction_lines, reduction_points
from kiln_cpp.dtypes import value_type
from kiln_cpp.handler import CppOpsHandler, pointer_type
from kiln_cpp.index_facts import pieces
from kiln_cpp.loops import merge_independent_loops, reuse_across_loops
from kiln_cpp.printer import cexpr
from kiln_cpp.split import (
    column_split,
    column_split_lines,
    full_reduction,
    full_reduction_lines,
    row_split,
    row_split_lines,
)
from kiln_cpp.statements import Define, ReductionLoop, render
from kiln_cpp.vectorize import (
    checks_indices,
    flag_lanes,
    reduction_loop,
    tiled_kernel_lines,
    tiled_loops,
    transposing,
)
from kiln_loopir.kernel import Kernel
from kiln_loopir.launch import LaunchGroup
from kiln_loopir.symbols import index_vars, reduction_vars

# below this many points of the whole iteration space a kernel runs on one thread
PARALLEL_MIN_POINTS = 32768


def _loops(var: str, ranges, indent: str, starts=None) -> list[str]:
    starts = starts or [0] * len(ranges)
    return [
        f"{indent}for (int64_t {var}{i} = {start}; {var}{i} < {cexpr(r)}; ++{var}{i})"
        for i, (r, start) in enumerate(zip(ranges, starts, strict=True))
    ]


def _reduction_point(kernel: Kernel) -> tuple[str, str]:
    """The row-major position of the current point in the reduction ranges, and their
    number of points, as C++."""
    position = sympy.S.Zero
    for var, size in zip(
        reduction_vars(len(kernel.reduction_ranges)), kernel.reduction_ranges, strict=True
    ):
        position = position * size + var
    points = math.prod(kernel.reduction_ranges) if kernel.reduction_ranges else 1
    return cexpr(sympy.expand(position)), cexpr(sympy.expand(points))


def _parallel_when(kernel: Kernel, ranges=None) -> str:
    ranges = kernel.ranges if ranges is None else ranges
    points = sympy.expand(math.prod(ranges) * math.prod(kernel.reduction_ranges or [1]))
    return f"{cexpr(points)} >= {PARALLEL_MIN_POINTS}"


def _pointwise(handler: CppOpsHandler) -> bool:
    """Whether the kernel's body is statements of its outer loops alone (no reduction
    loop, no scatter, which may write one element from several points)."""
    no_loops = not any(isinstance(i, ReductionLoop) for i in handler.items)
    return no_loops and not handler.has_scatter


def _simd_outer(kernel: Kernel, handler: CppOpsHandler) -> bool:
    """Whether the outer loops run lanes (``omp simd``): a pointwise kernel's."""
    return bool(kernel.ranges) and not kernel.reduction_ranges and _pointwise(handler)


def _outer_pragmas(
    kernel: Kernel, handler: CppOpsHandler, when=None, clause: str = ""
) -> list[str | None]:
    """The pragma before each outer loop (None for none), each ending in ``clause``. A
    pointwise kernel runs its last loop as ``omp simd`` and the others in parallel; a
    reduction kernel runs all its outer loops in parallel (its reduction loops are
    vectorised)."""
    n = len(kernel.ranges)
    pragmas: list[str | None] = [None] * n
    if n == 0 or handler.has_scatter:  # scatters may write one element from several points
        return pragmas
    when = when or _parallel_when(kernel)
    if not _simd_outer(kernel, handler):
        collapse = f" collapse({n})" if n > 1 else ""
        pragmas[0] = f"#pragma omp parallel for{collapse} if({when}){clause}"
    elif n == 1:
        pragmas[0] = f"#pragma omp parallel for simd if(parallel: {when}){clause}"
    else:
        collapse = f" collapse({n - 1})" if n > 2 else ""
        pragmas[0] = f"#pragma omp parallel for{collapse} if({when}){clause}"
        pragmas[-1] = f"#pragma omp simd{clause}"
    return pragmas


def _outer_loops(kernel: Kernel, handler: CppOpsHandler, ind: str, clause: str) -> list[str]:
    inner = transposing(kernel) if _pointwise(handler) else None
    if inner is not None:
        ranges = [cexpr(r) for r in kernel.ranges]
        when = _parallel_when(kernel)
        return [ind + line for line in tiled_loops(ranges, when, inner, clause)]
    out = []
    for pragma, loop in zip(
        _outer_pragmas(kernel, handler, clause=clause),
        _loops("x", kernel.ranges, ind),
        strict=True,
    ):
        out += [ind + pragma] if pragma else []
        out.append(loop)
    return out


def _split(kernel: Kernel, handler: CppOpsHandler):
    """The pieces a pointwise kernel runs in (see :func:`kiln_cpp.index_facts.pieces`)."""
    if kernel.reduction_ranges or kernel.has_scan() or handler.has_scatter:
        return None
    return pieces(handler.facts.cuts, index_vars(len(kernel.ranges)), kernel.ranges)


# with lanes over the outer loops, the out-of-range flag is a reduction of their pragmas
_FLAG_CLAUSE = " reduction(|:kiln_oob)"


def _flag_clause(kernel: Kernel, handler: CppOpsHandler, items: list) -> str:
    """The clause the outer loops' pragmas end with: :data:`_FLAG_CLAUSE` where they run
    lanes over a body that checks indices."""
    return _FLAG_CLAUSE if _simd_outer(kernel, handler) and checks_indices(items) else ""


def _piece_lines(kernel: Kernel, dim: int, spans: list[tuple[int, int]], ind: str) -> list[str]:
    """One loop nest per piece ``lo <= x{dim} < hi``, each rendered with its bounds known."""
    var = index_vars(len(kernel.ranges))[dim]
    lines = []
    for lo, hi in spans:
        handler = CppOpsHandler(kernel, {var: (lo, hi)})
        kernel.body(handler)
        ranges, starts = list(kernel.ranges), [0] * len(kernel.ranges)
        ranges[dim], starts[dim] = sympy.Integer(hi), lo
        sizes = [*ranges[:dim], sympy.Integer(hi - lo), *ranges[dim + 1 :]]
        clause = _flag_clause(kernel, handler, handler.items)
        pragmas = _outer_pragmas(kernel, handler, _parallel_when(kernel, sizes), clause)
        loops = []
        for pragma, loop in zip(pragmas, _loops("x", ranges, "", starts), strict=True):
            loops += [pragma] if pragma else []
            loops.append(loop)
        items = flag_lanes(handler.items, "kiln_oob") if clause else handler.items
        lines += [f"// piece: {lo} <= {var} < {hi}", *loops, "{"]
        lines += [ind + line for line in render(items)]
        lines.append("}")
    return lines


def render_kernel(kernel: Kernel) -> str:
    handler = CppOpsHandler(kernel)
    kernel.body(handler)
    params = [f"{pointer_type(handler.buffer_dtypes[a])} {a}" for a in kernel.args]
    params += [f"int64_t {s}" for s in kernel.size_args]
    lines = [f"// {kernel.header()}", f'extern "C" int {kernel.name}({", ".join(params)}) {{']
    lines.append("  int kiln_oob = 0;  // set when an indirect index is out of range")
    ind = "  "
    split = _split(kernel, handler)
    if split is not None:
        lines += [ind + line for line in _piece_lines(kernel, *split, ind)]
        lines += [ind + "return kiln_oob;", "}"]
        return "\n".join(lines) + "\n"
    if kernel.has_scan():
        lines += [ind + line for line in _scan_kernel_lines(kernel, handler, ind)]
        lines += [ind + "return kiln_oob;", "}"]
        return "\n".join(lines) + "\n"
    items = merge_independent_loops(handler.items)
    items = reuse_across_loops(items, *_reduction_point(kernel))
    if not handler.has_scatter and full_reduction(kernel, items):
        lines += [ind + line for line in full_reduction_lines(kernel, items[0], items[1:], ind)]
        lines += [ind + "return kiln_oob;", "}"]
        return "\n".join(lines) + "\n"
    passes = None if handler.has_scatter else column_passes(kernel, items)
    if passes is not None:
        if column_split(kernel, passes):
            body = column_split_lines(kernel, passes, _parallel_when(kernel), ind)
        else:
            body = column_reduction_lines(
                passes,
                _loops("x", kernel.ranges, ""),
                [cexpr(r) for r in kernel.ranges],
                _parallel_when(kernel),
                _loops("r", kernel.reduction_ranges, ""),
                reduction_points(kernel),
                ind,
            )
        lines += [ind + line for line in body]
        lines += [ind + "return kiln_oob;", "}"]
        return "\n".join(lines) + "\n"
    if not handler.has_scatter and row_split(kernel, items):
        body = row_split_lines(kernel, items[0], items[1:], _parallel_when(kernel), ind)
        lines += [ind + line for line in body]
        lines += [ind + "return kiln_oob;", "}"]
        return "\n".join(lines) + "\n"
    items = handler.hoist_invariant_indices(items)
    inner = None
    if not handler.has_scatter and not any(isinstance(i, ReductionLoop) for i in items):
        inner = transposing(kernel)
    if inner is not None and not checks_indices(items):
        body = tiled_kernel_lines(
            kernel,
            items,
            [cexpr(r) for r in kernel.ranges],
            _parallel_when(kernel),
            inner,
            ind,
        )
        lines += [ind + line for line in body]
        lines += [ind + "return kiln_oob;", "}"]
        return "\n".join(lines) + "\n"
    clause = ""
    if not any(isinstance(i, ReductionLoop) for i in items):
        clause = _flag_clause(kernel, handler, items)
        items = flag_lanes(items, "kiln_oob") if clause else items
    lines += _outer_loops(kernel, handler, ind, clause)
    lines.append(ind + "{")
    body_ind = ind * 2
    reduction_loops = _loops("r", kernel.reduction_ranges, "")
    for item in items:
        if isinstance(item, ReductionLoop):
            rendered = reduction_loop(
                reduction_loops,
                f"r{len(kernel.reduction_ranges) - 1}",
                cexpr(kernel.reduction_ranges[-1]) if kernel.reduction_ranges else "1",
                item.prologue,
                item.body,
                item.reductions,
                ind,
                f"kiln_oob{item.id}",
                points=reduction_points(kernel),
            )
            lines += [body_ind + line for line in rendered]
        else:
            lines.append(body_ind + item.render())
    lines.append(ind + "}")
    lines.append(ind + "return kiln_oob;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _scan_kernel_lines(kernel: Kernel, handler: CppOpsHandler, ind: str) -> list[str]:
    """A scan kernel: the outer loops in parallel, the scan loop in order inside them
    (its accumulators declared before it, every step stored)."""
    (loop,) = [i for i in handler.items if isinstance(i, ReductionLoop)]
    before = [i for i in handler.items if not isinstance(i, ReductionLoop)]  # the outer level's
    n = len(kernel.ranges)
    lines = []
    if n:
        collapse = f" collapse({n})" if n > 1 else ""
        lines.append(f"#pragma omp parallel for{collapse} if({_parallel_when(kernel)})")
    lines += _loops("x", kernel.ranges, "")
    lines.append("{")
    lines += [ind + line for line in render(before + loop.prologue)]
    (size,) = kernel.reduction_ranges
    blocked = _scan_in_blocks(loop, handler, cexpr(size), ind)
    if blocked is not None:
        lines += [ind + line for line in blocked]
    else:
        lines += [ind + line for line in _loops("r", kernel.reduction_ranges, "")]
        lines += [ind + "{", *[ind * 2 + line for line in render(loop.body)], ind + "}"]
    return lines + ["}"]


SCAN_BLOCK = 64  # the values of a scan computed ahead, vectorised, per block of steps


def _scan_in_blocks(loop: ReductionLoop, handler: CppOpsHandler, size: str, ind: str):
    """The scan loop in blocks of :data:`SCAN_BLOCK` steps: the values of a block computed
    first in an ``omp simd`` loop (a producer's math vectorised), then scanned in order. None
    where the values take no computing (a load) or the body does not split there (a value
    line touches the out-of-range flag, or the scan's part reads another of them)."""
    values, steps = loop.body[: loop.scan_start], loop.body[loop.scan_start :]
    defined = [s.name for s in values if isinstance(s, Define)]
    if len(values) < 2 or len(defined) != len(values):
        return None
    if any(v in s.reads for s in steps for v in defined if v != loop.scanned):
        return None
    vt = value_type(handler.dtypes[loop.scanned])
    r0 = "r0"
    return [
        f"for (int64_t {r0}_block = 0; {r0}_block < {size}; {r0}_block += {SCAN_BLOCK})",
        "{",
        f"{ind}const int64_t {r0}_end = std::min<int64_t>({r0}_block + {SCAN_BLOCK}, {size});",
        f"{ind}{vt} kiln_scanned[{SCAN_BLOCK}];",
        f"{ind}#pragma omp simd",
        f"{ind}for (int64_t {r0} = {r0}_block; {r0} < {r0}_end; ++{r0})",
        f"{ind}{{",
        *[ind * 2 + line for line in render(values)],
        f"{ind * 2}kiln_scanned[{r0} - {r0}_block] = {loop.scanned};",
        f"{ind}}}",
        f"{ind}for (int64_t {r0} = {r0}_block; {r0} < {r0}_end; ++{r0})",
        f"{ind}{{",
        f"{ind * 2}const {vt} {loop.scanned} = kiln_scanned[{r0} - {r0}_block];",
        *[ind * 2 + line for line in render(steps)],
        f"{ind}}}",
        "}",
    ]


def render_group(group: LaunchGroup) -> str:
    """One ``extern "C"`` function that runs a launch group's kernels in order and returns
    the first nonzero status (an indirect index out of range)."""
    params = [f"{pointer_type(group.arg_dtypes[a])} {a}" for a in group.args]
    params += [f"int64_t {s}" for s in group.size_args]
    lines = [f"// {group.header()}", f'extern "C" int {group.name}({", ".join(params)}) {{']
    lines.append("  int status = 0;")
    for kernel in group.kernels:
        args = [*kernel.args, *(str(s) for s in kernel.size_args)]
        lines.append(f"  if ((status = {kernel.name}({', '.join(args)}))) return status;")
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"
