"""Compile with Kiln for a benchmark and make sure the compiled code is what runs.

A benchmark that times Kiln falling back to eager would report eager's speed under Kiln's
name. :func:`compile_checked` turns Kiln's RuntimeWarnings into errors while the first
calls compile (a graph whose code generation fails, a frame capture gives up on), asks for
errors instead of the eager fallback (``options={"fallback": False}``), and reads the debug
folder the compile wrote: every compiled graph leaves a host program there
(``frameNNN/forward_host.py``, ``backward_host.py``), every graph break a
``graph_break.txt``. No host program means nothing was compiled: that raises.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import kiln


@dataclass(frozen=True)
class Compiled:
    """What the first calls of a compiled model compiled."""

    frames: int  # captured graphs
    host_programs: int  # aten graphs turned into generated code (forward, backward)
    graph_breaks: int

    def describe(self) -> str:
        breaks = f", {self.graph_breaks} graph break(s)" if self.graph_breaks else ""
        return f"{self.frames} graph(s), {self.host_programs} compiled{breaks}"


def read_debug_dir(root: Path) -> Compiled:
    frames = [d for d in sorted(root.glob("frame*")) if d.is_dir()]
    return Compiled(
        frames=len(frames),
        host_programs=sum(len(list(d.glob("*_host*.py"))) for d in frames),
        graph_breaks=sum((d / "graph_break.txt").exists() for d in frames),
    )


def compile_checked(
    model: Callable,
    first_call: Callable[[Callable], object],
    *,
    mode: str | None = None,
    calls: int = 2,
    options: dict | None = None,
) -> tuple[Callable, Compiled]:
    """``kiln.compile(model, mode=mode, options=options)`` and what it compiled during
    ``calls`` runs of ``first_call(compiled)`` (a forward, or a training step with its
    backward; the second run catches a recompile).

    Raises if Kiln warned (a fallback to eager) or compiled no graph.
    """
    debug = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    try:
        compiled = kiln.compile(
            model,
            mode=mode,
            options={**(options or {}), "debug_dir": str(debug), "fallback": False},
        )
        with warnings.catch_warnings():
            # "kiln: ... runs eagerly", "kiln-capture runs ... eagerly", mode fallbacks
            warnings.filterwarnings("error", message="kiln", category=RuntimeWarning)
            for _ in range(calls):
                first_call(compiled)
        found = read_debug_dir(debug)
    finally:
        shutil.rmtree(debug, ignore_errors=True)
    if found.host_programs == 0:
        raise RuntimeError(
            f"kiln compiled no graph for {getattr(model, '__qualname__', type(model).__name__)} "
            f"({found.frames} frame(s) captured): its calls would run eagerly"
        )
    return compiled, found
