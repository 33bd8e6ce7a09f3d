"""Rendering a kernel as reference Python and compiling it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln_loopir.kernel import Kernel
from kiln_loopir.ops import TraceHandler, dtype_str
from kiln_loopir.reference import runtime
from kiln_loopir.symbols import py_expr


class _RenderHandler(TraceHandler):
    """The tracing handler, with reductions and scans told the grid they walk."""

    def __init__(self, nred: int) -> None:
        super().__init__()
        self.nred = nred

    def reduction(self, reduction_type, value, src_dtype):
        return self._emit(
            f"reduction({reduction_type!r}, {value}, {dtype_str(src_dtype)}, grid, {self.nred}, "
            "device)"
        )

    def scan(self, scan_type, value, src_dtype):
        return self._emit(f"scan({scan_type!r}, {value}, {dtype_str(src_dtype)}, grid, device)")


class ReferenceCodegen:
    """A codegen (``kiln_loopir.Codegen``) that runs kernels as vectorised torch Python.

    Slow and exact: it exists to check the IR and the host program without a compiler. It
    serves every device torch does, but is only used when asked for by name
    (``codegen="reference"``).
    """

    name = "reference"
    device_types = ("cpu", "cuda")
    renders_scans = True

    def render(self, kernel: Kernel) -> str:
        params = list(kernel.args) + [str(s) for s in kernel.size_args]
        grid = list(kernel.ranges) + list(kernel.reduction_ranges)
        lines = [f"def {kernel.name}({', '.join(params)}):"]
        body = [
            f'"""{kernel.header()}"""',
            f"device = {kernel.args[0] if kernel.args else repr(str(kernel.device))}"
            + (".device" if kernel.args else ""),
            "grid = ("
            + ", ".join(py_expr(g) for g in grid)
            + ("," if len(grid) == 1 else "")
            + ")",
        ]
        for d in range(len(kernel.ranges)):
            body.append(f"x{d} = index_var(grid, {d}, device)")
        for d in range(len(kernel.reduction_ranges)):
            body.append(f"r{d} = index_var(grid, {len(kernel.ranges) + d}, device)")
        for name in kernel.args:
            body.append(f"{name} = flat({name})")
        handler = _RenderHandler(len(kernel.reduction_ranges))
        kernel.body(handler)
        body += handler.lines
        return "\n".join(lines + ["    " + line for line in body]) + "\n"

    def compile(self, sources: Sequence[str]) -> list[Callable]:
        kernels = []
        for source in sources:
            namespace = runtime.namespace()
            exec(compile(source, "<kiln-loopir reference kernel>", "exec"), namespace)
            name = source.split("(", 1)[0].removeprefix("def ").strip()
            kernels.append(namespace[name])
        return kernels
