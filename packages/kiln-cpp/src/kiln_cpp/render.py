"""A kernel as one ``extern "C"`` C++ function (returning 1 when an indirect index was out of
range): the outer loops (parallel with OpenMP above
a size threshold), the reduction loops inside them, and the body the handler rendered."""

from __future__ import annotations

import math

import sympy

from kiln_cpp.handler import CppOpsHandler, ReductionLoop, pointer_type
from kiln_cpp.printer import cexpr
from kiln_loopir.kernel import Kernel

# below this many points of the whole iteration space a kernel runs on one thread
PARALLEL_MIN_POINTS = 32768


def _loops(var: str, ranges, indent: str) -> list[str]:
    return [
        f"{indent}for (int64_t {var}{i} = 0; {var}{i} < {cexpr(r)}; ++{var}{i})"
        for i, r in enumerate(ranges)
    ]


def render_kernel(kernel: Kernel) -> str:
    handler = CppOpsHandler(kernel)
    kernel.body(handler)
    params = [f"{pointer_type(handler.buffer_dtypes[a])} {a}" for a in kernel.args]
    params += [f"int64_t {s}" for s in kernel.size_args]
    lines = [f"// {kernel.header()}", f'extern "C" int {kernel.name}({", ".join(params)}) {{']
    lines.append("  int kiln_oob = 0;  // set when an indirect index is out of range")
    ind = "  "
    if kernel.ranges:
        points = sympy.expand(math.prod(kernel.ranges) * math.prod(kernel.reduction_ranges or [1]))
        if not handler.has_scatter:  # scatters may write one element from several points
            collapse = f" collapse({len(kernel.ranges)})" if len(kernel.ranges) > 1 else ""
            lines.append(
                f"{ind}#pragma omp parallel for{collapse} if({cexpr(points)} >= "
                f"{PARALLEL_MIN_POINTS})"
            )
        lines += _loops("x", kernel.ranges, ind)
    lines.append(ind + "{")
    body_ind = ind * 2
    for item in handler.items:
        if isinstance(item, ReductionLoop):
            lines += [body_ind + line for line in item.prologue]
            lines += _loops("r", kernel.reduction_ranges, body_ind)
            lines.append(body_ind + "{")
            lines += [body_ind + ind + line for line in item.body]
            lines.append(body_ind + "}")
        else:
            lines.append(body_ind + item)
    lines.append(ind + "}")
    lines.append(ind + "return kiln_oob;")
    lines.append("}")
    return "\n".join(lines) + "\n"
