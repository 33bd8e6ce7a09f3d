"""``explain(fn)(*args)``: what capture made of one call, without changing what it returns."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass
class ExplainOutput:
    graphs: list = field(default_factory=list)
    graph_breaks: list = field(default_factory=list)  # (reason, user source line)
    guards: list[str] = field(default_factory=list)  # guard function sources
    recompiles: list[str] = field(default_factory=list)
    eager: list[str] = field(default_factory=list)  # functions that ran eagerly, and why
    result: object = None

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def op_count(self) -> int:
        return sum(self.op_counts(g).total() for g in self.graphs)

    @staticmethod
    def op_counts(gm) -> collections.Counter:
        counts = collections.Counter()
        for node in gm.graph.nodes:
            if node.op in ("call_function", "call_method", "call_module"):
                target = (
                    node.target
                    if isinstance(node.target, str)
                    else getattr(node.target, "__name__", str(node.target))
                )
                counts[target] += 1
        return counts

    def __str__(self) -> str:
        lines = [
            f"graphs: {self.graph_count}, ops: {self.op_count}, "
            f"graph breaks: {len(self.graph_breaks)}"
        ]
        for i, gm in enumerate(self.graphs):
            ops = ", ".join(f"{k} x{v}" for k, v in self.op_counts(gm).most_common())
            lines.append(f"graph {i}: {ops or 'no ops'}")
        for reason, where in self.graph_breaks:
            lines.append(f"graph break: {reason}\n    at {where}")
        for name, reason in self.eager:
            lines.append(f"ran eagerly: {name}: {reason}")
        for reason in self.recompiles:
            lines.append(f"recompile: {reason}")
        for source in self.guards:
            lines.append(source.rstrip())
        return "\n".join(lines)


class _Recorder:
    def __init__(self, out: ExplainOutput):
        self.out = out

    def backend(self, gm, example_inputs):
        self.out.graphs.append(gm)
        return gm.forward

    def on_capture(self, captured, result):
        self.out.guards.append(result.guard.source)
        if result.graph_break is not None:
            self.out.graph_breaks.append((result.graph_break.reason, result.graph_break.where))

    def on_eager(self, captured, reason):
        self.out.eager.append((captured.fn.__qualname__, reason))
        return True  # the report says so


def explain(fn, **options):
    """``explain(fn)(*args, **kwargs)`` runs ``fn`` once through capture and reports."""
    from kiln_capture.api import capture

    def run(*args, **kwargs) -> ExplainOutput:
        out = ExplainOutput()
        recorder = _Recorder(out)
        captured = capture(fn, recorder.backend, **options)
        target = getattr(captured, "_captured", captured)
        target.observer = recorder
        out.result = captured(*args, **kwargs)
        out.recompiles = list(target.stats.recompile_reasons)
        return out

    return run
