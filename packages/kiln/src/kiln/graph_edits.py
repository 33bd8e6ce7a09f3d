"""Small edits of aten graphs that keep each node's fake value (``meta["val"]``), which
the passes after them read: shared by :mod:`kiln.folding`, :mod:`kiln.freezing` and
:mod:`kiln.padding`."""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.fx


def value(node: object, key: str = "val") -> torch.Tensor | None:
    """A node's fake tensor, or None (not a node, or not a tensor). ``key``: where the node
    keeps it (``"example_value"`` in a captured graph)."""
    val = node.meta.get(key) if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def call(graph: torch.fx.Graph, target, *args, **kwargs) -> torch.fx.Node:
    """A new node of ``graph`` (at its insertion point) calling ``target``, its fake value
    computed from its inputs'."""
    node = graph.call_function(target, args, kwargs)
    vals = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    with _fake_mode(vals):
        node.meta["val"] = target(*vals[0], **vals[1])
    return node


def computed_from(node: torch.fx.Node, inputs: Collection[torch.fx.Node]) -> bool:
    """Whether ``node`` is one of ``inputs`` or computed from them alone."""
    if node in inputs:
        return True
    if node.op != "call_function" or not node.all_input_nodes:
        return False
    return all(computed_from(x, inputs) for x in node.all_input_nodes)


def copy_graph(gm: torch.fx.GraphModule) -> tuple[torch.fx.Graph, dict]:
    """A copy of ``gm``'s graph to edit, and each node's copy; :func:`module_of` makes the
    module once the edits are done (a module generates and compiles its code when made)."""
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    return graph, copies


def module_of(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """``graph``, edited from :func:`copy_graph`'s copy of ``gm``'s, as a module over
    ``gm``'s attributes, with ``gm``'s ``meta``."""
    new = torch.fx.GraphModule(gm, graph)
    new.meta.update(gm.meta)
    return new


def _fake_mode(values: object):
    found: list[torch.Tensor] = []
    torch.fx.node.map_aggregate(
        values,
        lambda v: (
            found.append(v) if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode") else None
        ),
    )
    if not found:
        raise ValueError("no fake tensor among a new node's inputs")
    return found[0].fake_mode


def _is_fake(value: object) -> bool:
    return isinstance(value, torch.Tensor) and hasattr(value, "fake_mode")
