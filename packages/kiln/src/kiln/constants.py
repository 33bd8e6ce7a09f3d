"""Tensor constants of an aten graph (its ``get_attr`` nodes) passed as inputs instead.

kiln-loopir's decomposition step re-traces a graph under its fake mode, where a real
tensor read by a ``get_attr`` node is refused. Kiln hands it graphs whose constants are
extra placeholders at the end, each with a fake value, and passes the constants at every
call (bound as the host program's last inputs: ``HostProgram.with_last_inputs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx


def _fake_mode(gm: torch.fx.GraphModule):
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and hasattr(val, "fake_mode"):
            return val.fake_mode
    return None


def lift_constants(
    gm: torch.fx.GraphModule, example_inputs: Sequence[object]
) -> tuple[torch.fx.GraphModule, list[object], list[torch.Tensor]]:
    """``(graph, example_inputs, constants)``: the graph reads its tensor constants from
    extra last inputs; ``gm`` itself is left as it is."""
    nodes = [
        n
        for n in gm.graph.nodes
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.Tensor)
    ]
    fake_mode = _fake_mode(gm)
    if not nodes or fake_mode is None:
        return gm, list(example_inputs), []
    lifted = torch.fx.GraphModule(gm, gm.graph.__deepcopy__({}))  # a copy of the graph
    graph = lifted.graph
    last_input = list(graph.find_nodes(op="placeholder"))[-1]
    constants, fakes = [], []
    for node in [
        n for n in graph.nodes if n.op == "get_attr" and n.target in {m.target for m in nodes}
    ]:
        value = getattr(gm, node.target)
        with graph.inserting_after(last_input):
            placeholder = graph.placeholder(f"constant_{len(constants)}")
        fake = node.meta.get("val")
        if not isinstance(fake, torch.Tensor):
            fake = fake_mode.from_tensor(value)
        placeholder.meta["val"] = fake
        node.replace_all_uses_with(placeholder)
        graph.erase_node(node)
        last_input = placeholder
        constants.append(value)
        fakes.append(fake)
    lifted.recompile()
    return lifted, [*example_inputs, *fakes], constants
