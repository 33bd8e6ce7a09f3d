"""``TritonCodegen``: kiln-loopir's codegen protocol for CUDA GPUs, as Triton kernels."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence

from kiln_loopir.kernel import Kernel
from kiln_triton import autotune
from kiln_triton.launcher import TritonKernel
from kiln_triton.render import render_kernel, source_hash


def load_module(source: str):
    """Import a kernel's source (Triton reads a ``@triton.jit`` function's source from its
    file): written once to the cache under its hash."""
    digest = source_hash(source)
    folder = autotune.cache_dir() / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"k{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".py.{os.getpid()}")
        tmp.write_text(source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(f"kiln_triton_kernel_{digest}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module, digest


class TritonCodegen:
    """Renders kernels as Triton (see :mod:`kiln_triton.render`) and returns launchers that
    pick and cache launch configurations (:mod:`kiln_triton.launcher`)."""

    name = "triton"
    device_types = ("cuda",)

    def render(self, kernel: Kernel) -> str:
        return render_kernel(kernel)

    def compile(self, sources: Sequence[str]) -> list[Callable]:
        kernels = []
        for source in sources:
            module, digest = load_module(source)
            kernels.append(TritonKernel(module, digest))
        return kernels

    def __repr__(self) -> str:
        return "TritonCodegen()"
