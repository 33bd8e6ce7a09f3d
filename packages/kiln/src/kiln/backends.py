"""Backends by name, and the session that runs one ``kiln.compile`` call's captures.

- ``"auto"``: the full stack, with the installed code generator for the graph's device;
  a graph on a device with none runs its aten graph eagerly, with a warning;
- ``"kiln"``: the full stack; no code generator for the device is an error;
- ``"aot_eager"``: kiln-autograd's aten graphs, run eagerly (no code generation);
- ``"eager"``: the captured graph as it is (capture only);
- a callable ``backend(gm, example_inputs) -> callable``: ``torch.compile``'s contract.

Whatever the backend, the session gives each captured graph a :class:`~kiln.frames.Frame`
and writes the captured graph, guards, graph breaks and recompiles to the logs and the
debug folder.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.fx

from kiln import logs
from kiln.collector import collecting_less
from kiln.config import Config
from kiln.frames import Frame
from kiln.pipeline import aot_backend
from kiln.regional import compile_callees, compile_submodules


class Session:
    """The backend and capture observer of one ``kiln.compile`` call."""

    def __init__(self, config: Config) -> None:
        self.config = config

    # --- kiln_capture's backend contract ----------------------------------------------

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list[object]) -> Callable:
        frame = Frame(self.config.options.debug_dir)
        frame.function = _captured_function_name(gm)
        gm.meta["kiln_frame"] = frame
        if frame.folder is not None or logs.enabled("graph"):  # printing costs ~20 ms
            code = gm.print_readable(print_output=False)
            logs.logger("graph").info("%s captured graph:\n%s", frame.name, code)
            frame.dump("captured_graph.py", code)
        with collecting_less():  # collections walk the compile's garbage, not the model
            return self.backend_for(frame)(gm, example_inputs)

    def backend_for(self, frame: Frame) -> Callable:
        backend = self.config.backend
        if callable(backend):
            return backend
        if backend == "eager":
            return lambda gm, example_inputs: gm.forward
        return aot_backend(self.config, frame, generate=backend != "aot_eager")

    # --- kiln_capture's observer ------------------------------------------------------

    def on_capture(self, captured, result) -> None:
        name = captured.fn.__qualname__
        frame = result.graph.meta.get("kiln_frame") if result.graph is not None else None
        if frame is not None:
            frame.function = name
            frame.dump("function.txt", f"{name}\n{_where(captured.fn)}")
            frame.dump("guards.py", result.guard.source)
            frame.log_perf("compiled")
        label = frame.describe() if frame is not None else name
        logs.logger("guards").info("%s guards:\n%s", label, result.guard.source)
        if captured.stats.compiles > 1 and captured.stats.recompile_failures:
            failed = captured.stats.recompile_failures[-1]
            made = captured.stats.made_dynamic[-1]
            logs.logger("recompiles").info(
                "%s recompiled (compile %d), %d guard(s) failed (as captured, now):%s%s",
                label,
                captured.stats.compiles,
                len(failed),
                "".join(f"\n    guard failed: {line}" for line in failed),
                f"\n    now symbolic: {', '.join(made)}" if made else "",
            )
        if result.graph_break is not None:
            brk = result.graph_break
            logs.logger("graph_breaks").info(
                "%s graph break: %s\n    at %s", label, brk.reason, brk.where
            )
            if frame is not None:
                frame.dump("graph_break.txt", f"{brk.reason}\nat {brk.where}")

    def on_eager(self, captured, reason) -> bool:
        """Compile what the frame calls instead; True where a warning said so (capture
        warns itself otherwise)."""
        logs.logger("graph_breaks").info("%s runs eagerly: %s", captured.fn.__qualname__, reason)
        owner = getattr(captured, "bound_self", None)
        if isinstance(owner, torch.nn.Module):  # a module's forward, or another method
            return bool(compile_submodules(owner, self.config, reason, captured.fn.__name__))
        return bool(compile_callees(captured, self.config, reason))


def _captured_function_name(gm: torch.fx.GraphModule) -> str:
    """The qualified name of the function whose frame ``gm`` was captured from.

    kiln-capture calls the backend from ``convert_frame(fn, ...)``; the name is read from
    that call's ``fn`` (``?`` if the call is not found), so that the messages of the
    compile itself can name the function. Capture's observer confirms it afterwards.
    """
    if "kiln_function" in gm.meta:
        return gm.meta["kiln_function"]
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "convert_frame" and "kiln_capture" in code.co_filename:
            return getattr(frame.f_locals.get("fn"), "__qualname__", "?")
        frame = frame.f_back
    return "?"


def _where(fn) -> str:
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
