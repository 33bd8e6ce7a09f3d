"""Small edits of aten graphs that keep each node's fake value (``meta["val"]``), which
the passes after them read: shared by the rewrites of aten graphs (:mod:`kiln.folding`,
:mod:`kiln.freezing`, :mod:`kiln.padding`, ...)."""

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


# the floating dtypes the rewrites of products and convolutions take
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def conv2d_values(node: torch.fx.Node, device_type: str):
    """``(input, weight, output)``, the fake values of a 2-D convolution (not transposed)
    on ``device_type`` in one of :data:`FLOAT_DTYPES`; None for any other node."""
    if node.op != "call_function" or node.target is not torch.ops.aten.convolution.default:
        return None
    x_val, w_val, out = value(node.args[0]), value(node.args[1]), value(node)
    if x_val is None or w_val is None or out is None or out.device.type != device_type:
        return None
    transposed = node.args[6]
    if x_val.dim() != 4 or out.dtype not in FLOAT_DTYPES or transposed:
        return None
    return x_val, w_val, out


def calls(node: object, target) -> bool:
    """Whether ``node`` is a call of ``target``."""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def refresh_values(graph: torch.fx.Graph, changed: Collection[torch.fx.Node]) -> None:
    """Compute again the fake value of each view of a node of ``changed`` (a node with a
    new layout: a slice where a contiguous tensor was), and of views of those in turn. An
    op that computes a new tensor keeps its value: its layout is the compiler's choice, and
    one the graph returns keeps eager's. Raises ``RuntimeError`` where a view cannot view
    the new layout."""
    changed = set(changed)
    for node in graph.nodes:
        if node.op != "call_function" or node in changed or not is_view(node):
            continue
        if not any(x in changed for x in node.all_input_nodes):
            continue
        vals = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        with _fake_mode(vals):
            new = node.target(*vals[0], **vals[1])
        if not _same_layouts(node.meta.get("val"), new):
            changed.add(node)
        node.meta["val"] = new


def _same_layouts(old: object, new: object) -> bool:
    if isinstance(old, (tuple, list)) and isinstance(new, (tuple, list)):
        return len(old) == len(new) and all(map(_same_layouts, old, new))
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        return old.shape == new.shape and old.stride() == new.stride() and old.dtype == new.dtype
    return type(old) is type(new)


def is_view(node: torch.fx.Node) -> bool:
    """Whether ``node``'s op returns a view of its input (``_unsafe_view`` too, which
    ``reshape`` leaves after its copy)."""
    return bool(getattr(node.target, "is_view", False)) or (
        node.target is torch.ops.aten._unsafe_view.default
    )


def returned(node: torch.fx.Node) -> bool:
    """Whether the graph returns ``node`` or a view of it: a rewrite that gives ``node``
    another layout would hand the user other strides than eager's."""
    return any(user.op == "output" or (is_view(user) and returned(user)) for user in node.users)


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
