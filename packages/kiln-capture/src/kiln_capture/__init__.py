"""Bytecode capture with guards.

kiln-capture turns a Python function or ``nn.Module`` into ``torch.fx`` graphs by
interpreting its bytecode symbolically with fake tensors. Each capture gets a guard
function (generated Python source) that decides when it can be reused, new bytecode that
calls the compiled graph and replays Python side effects, and resume functions where the
graph breaks. Any ``torch.compile``-style backend ``backend(gm, example_inputs) ->
callable`` compiles the graphs.

    >>> captured = kiln_capture.capture(fn, backend)
    >>> captured(x, y)              # captures on the first call, then reuses
    >>> kiln_capture.explain(fn)(x, y)   # graphs, graph breaks, guards
    >>> kiln_capture.mark_dynamic(x, 0)  # x's dim 0 is symbolic from the first capture
"""

from kiln_capture.__about__ import __version__
from kiln_capture.api import CapturedFunction, CapturedModule, capture
from kiln_capture.dynamic_shapes import mark_dynamic, mark_static
from kiln_capture.exc import Unsupported
from kiln_capture.explain import ExplainOutput, explain

__all__ = [
    "CapturedFunction",
    "CapturedModule",
    "ExplainOutput",
    "Unsupported",
    "__version__",
    "capture",
    "explain",
    "mark_dynamic",
    "mark_static",
]
