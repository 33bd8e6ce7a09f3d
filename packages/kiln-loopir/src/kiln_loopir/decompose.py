"""The decompose step: rewrite the ops loopir lowers through decompositions (the norms).

Each node of an op in a small table from ``torch._decomp`` is replaced by the graph its
decomposition traces to (``make_fx`` of that one op, under the graph's fake mode, on the
node's input values); every other node is copied as it is, with its metadata. The
graph's inputs are named ``arg0_1, arg1_1 ...``. Every call node of the result records
the op it came from in ``meta["original_aten"]`` (``aten.native_layer_norm`` on the nodes
of a layer norm; the op a node already recorded, where the graph's tracer kept one),
which kernel names are made of.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._decomp import get_decompositions
from torch.fx.experimental.proxy_tensor import make_fx, set_original_aten_op

aten = torch.ops.aten

DECOMPOSED_OPS = [
    aten.native_layer_norm.default,
    aten.native_layer_norm_backward.default,
    aten.native_group_norm.default,
    aten.native_batch_norm_backward.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit_functional.default,
    aten.std.correction,
    aten.std_mean.correction,
    aten.linalg_vector_norm.default,
    aten.mish.default,
    aten.logit.default,
    aten.glu.default,
]


def decomposition_table() -> dict:
    return get_decompositions(DECOMPOSED_OPS)


def needs_decomposition(gm: torch.fx.GraphModule) -> bool:
    table = decomposition_table()
    return any(n.op == "call_function" and n.target in table for n in gm.graph.nodes)


def decompose(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with the ops of :data:`DECOMPOSED_OPS` decomposed (``gm`` itself if none)."""
    if not needs_decomposition(gm):
        return gm
    table = decomposition_table()
    fake_mode = _fake_mode(gm)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, object] = {}
    attrs: dict[str, object] = {}  # the tensors the graph's get_attr nodes read
    traced: dict[tuple, torch.fx.GraphModule] = {}  # each decomposition traced, by its key
    inputs = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            new = graph.placeholder(f"arg{inputs}_1")
            new.meta = dict(node.meta)
            env[node] = new
            inputs += 1
        elif node.op == "output":
            graph.output(torch.fx.node.map_arg(node.args[0], env.__getitem__))
        elif node.target is operator.getitem and isinstance(env[node.args[0]], tuple):
            env[node] = env[node.args[0]][node.args[1]]  # an output of a decomposed op
        elif node.op == "call_function" and node.target in table:
            env[node] = _decomposed(graph, node, env, table, fake_mode, traced)
        else:
            new = graph.node_copy(node, env.__getitem__)
            if node.op == "get_attr":
                attrs[node.target] = _attribute(gm, node.target)
            if isinstance(node.target, torch._ops.OpOverload):
                new.meta.setdefault("original_aten", node.target)
            env[node] = new
    return torch.fx.GraphModule(attrs, graph)


def _attribute(module: torch.nn.Module, target: str) -> object:
    value: object = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _fake_mode(gm: torch.fx.GraphModule):
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = next(
        (v.fake_mode for v in vals if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode")),
        None,
    )
    if fake_mode is None:
        raise ValueError(
            "the graph's placeholders carry no fake tensors in meta['val']: trace it with "
            "make_fx(..., tracing_mode='fake' or 'symbolic') first"
        )
    return fake_mode


def _decomposed(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    env: dict[torch.fx.Node, object],
    table: dict,
    fake_mode,
    traced_before: dict[tuple, torch.fx.GraphModule],
) -> object:
    """Add to ``graph`` the nodes ``node``'s decomposition traces to, reading what ``env``
    maps its inputs to; returns what stands for its result (a tuple for several). A node
    like one traced before (the same op, constants and input layouts, all sizes numbers:
    the layer norms of a transformer) reuses that trace (``traced_before``)."""
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    inputs = [k for k, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]
    key = _trace_key(node, leaves, spec, inputs)
    traced = traced_before.get(key) if key is not None else None
    if traced is None:
        traced = _trace(node, leaves, spec, inputs, table, fake_mode)
        if key is not None:
            traced_before[key] = traced
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    sub_env = {p: env[leaves[k]] for p, k in zip(placeholders, inputs, strict=True)}
    for sub in traced.graph.nodes:
        if sub.op == "output":
            result = torch.fx.node.map_arg(sub.args[0], sub_env.__getitem__)
            return tuple(result) if isinstance(result, (list, tuple)) else result
        if sub.op == "get_attr":  # none of the table's decompositions makes a tensor
            raise NotImplementedError(f"the decomposition of {node.target} holds a tensor")
        if sub.op != "placeholder":
            sub_env[sub] = graph.node_copy(sub, sub_env.__getitem__)
    raise AssertionError("a traced graph has an output node")


def _trace_key(node: torch.fx.Node, leaves: list, spec, inputs: list[int]) -> tuple | None:
    """What ``node``'s decomposition depends on, or None where a size is a symbol (or a
    constant cannot be compared)."""
    layouts = []
    for k in inputs:
        val = leaves[k].meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        layout = (tuple(val.shape), val.stride(), val.storage_offset())
        if not all(type(n) is int for n in (*layout[0], *layout[1], layout[2])):
            return None
        layouts.append((layout, val.dtype, val.device, val.requires_grad))
    constants = tuple((type(leaf), leaf) for k, leaf in enumerate(leaves) if k not in inputs)
    # the recorded op by its name: a graph's tracer may record copies of an op, which hash
    # alike but compare unequal (each layer norm of a model was traced again)
    original = node.meta.get("original_aten")
    key = (node.target, str(original), spec, constants, tuple(layouts))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _trace(node, leaves, spec, inputs, table, fake_mode) -> torch.fx.GraphModule:
    """``make_fx`` of ``node``'s op through the table, on its input values."""

    def run(*values):
        filled = list(leaves)
        for k, value in zip(inputs, values, strict=True):
            filled[k] = value
        args, kwargs = pytree.tree_unflatten(filled, spec)
        out = node.target(*args, **kwargs)
        return list(out) if isinstance(out, tuple) else out

    origin = node.meta.get("original_aten") or node.target
    with (
        fake_mode,
        fx_traceback.preserve_node_meta(),
        fx_traceback.set_current_meta(node),
        set_original_aten_op(origin),
    ):
        traced = make_fx(run, decomposition_table=table, tracing_mode="real")(
            *[leaves[k].meta["val"] for k in inputs]
        )
    traced.graph.eliminate_dead_code()
    return traced
