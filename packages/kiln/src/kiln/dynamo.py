"""Kiln as a ``torch.compile`` backend: ``torch.compile(model, backend="kiln")``.

The ``kiln`` distribution registers :func:`kiln_backend` in torch's
``torch_dynamo_backends`` entry-point group. torch captures the graphs; Kiln runs its
autograd, loop IR and code generation on each one, with the same options as
``kiln.compile`` (``torch.compile(..., options={"debug_dir": ...})``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch.fx

from kiln.config import make_config
from kiln.frames import Frame
from kiln.pipeline import aot_backend


def kiln_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[object],
    *,
    mode: str | None = None,
    options: Mapping[str, object] | None = None,
) -> Callable:
    """``torch.compile``'s backend contract: the full Kiln stack for one graph."""
    config = make_config("auto", mode, None, False, options)
    frame = Frame(config.options.debug_dir)
    frame.function = "torch.compile graph"
    frame.dump("captured_graph.py", gm.print_readable(print_output=False))
    compiled = aot_backend(config, frame, generate=True)(gm, example_inputs)
    frame.log_perf("compiled")
    return compiled
