"""Grouped-query attention without the repeated keys and values, on an aten graph.

A Llama-style layer shares each key and value head among ``group`` query heads, and
repeats them before attention (Hugging Face's ``repeat_kv``)::

    k = k[:, :, None].expand(b, kv_heads, group, n, d).reshape(b, kv_heads * group, n, d)

In the aten graph that is ``unsqueeze(x, 2)`` → ``expand`` → ``clone`` → ``view``: a copy
of every key and value, ``group`` times larger than they are, written and read back by
the attention op. :func:`grouped_query_attention` rewrites a fused attention op (cuDNN, flash
or memory-efficient) whose keys and values are both such repeats of the same ``group``
to ``kiln_loopir::grouped_attention`` over the tensors before the repeat, which Kiln's
attention kernel reads in place (query head ``h`` reads head ``h // group``).

Only where nothing else reads the repeats or the op's other results (a training forward
keeps its log-sum-exp for the backward, and its op), without dropout, at static sizes.
The new op lays its output out as the op it replaces did. On CUDA.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from kiln.graph_edits import call, calls, copy_graph, module_of, value
from kiln_loopir import GROUPED_ATTENTION

aten = torch.ops.aten

# op -> positions of (bias (None: none), dropout_p, is_causal); ``scale`` is a keyword
FUSED_ATTENTION = {
    aten._scaled_dot_product_cudnn_attention.default: (3, 5, 6),
    aten._scaled_dot_product_efficient_attention.default: (3, 5, 6),
    aten._scaled_dot_product_flash_attention.default: (None, 3, 4),
}


def grouped_query_attention(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose attention over repeated keys and values reads them before
    the repeat; None where it has none."""
    found = {node: match for node in gm.graph.nodes if (match := _match(node)) is not None}
    if not found:
        return None
    graph, copies = copy_graph(gm)
    for node, (output, query, key, value_, bias, causal, scale, stride) in found.items():
        args = [copies.get(x, x) for x in (query, key, value_, bias)]
        with graph.inserting_before(copies[node]):
            grouped = call(graph, GROUPED_ATTENTION, *args, causal, scale, stride)
        copies[output].replace_all_uses_with(grouped)
        _erase_unread(graph, copies[node])
    graph.lint()
    return module_of(gm, graph)


def _match(node: torch.fx.Node):
    """``(output, query, key, value, bias, is_causal, scale, output strides)`` where
    ``node`` is a fused attention over repeated keys and values this rewrites, else None
    (``output``: the getitem of its result, the only one read)."""
    positions = FUSED_ATTENTION.get(node.target) if node.op == "call_function" else None
    if positions is None or len(node.args) < 3:
        return None
    bias_at, dropout_at, causal_at = positions
    read = [user for user in node.users if user.users]
    if len(read) != 1 or read[0].target is not operator.getitem or read[0].args[1] != 0:
        return None
    output = read[0]

    def arg(position, default):
        given = position is not None and len(node.args) > position
        return node.args[position] if given else default

    if arg(dropout_at, 0.0) != 0.0:
        return None
    query = node.args[0]
    (key, key_group), (value_, value_group) = (_repeated(node.args[i], node) for i in (1, 2))
    if key is None or value_ is None or key_group != value_group:
        return None
    q, out = value(query), value(output)
    if q is None or out is None or out.shape != q.shape:
        return None
    scale = node.kwargs.get("scale")
    scale = float(scale) if scale is not None else q.size(-1) ** -0.5
    causal, stride = bool(arg(causal_at, False)), list(out.stride())
    return output, query, key, value_, arg(bias_at, None), causal, scale, stride


def _repeated(node: object, reader: torch.fx.Node) -> tuple[torch.fx.Node | None, int]:
    """``(x, group)`` where ``node`` is ``x`` ([b, h, n, d]) with each head repeated
    ``group`` times, read by ``reader`` alone; else ``(None, 0)``."""
    views = (aten.view.default, aten._unsafe_view.default)  # reshape's copy, then a view
    if not any(calls(node, view) for view in views) or list(node.users) != [reader]:
        return None, 0
    clone = node.args[0]
    if not calls(clone, aten.clone.default) or len(clone.users) != 1:
        return None, 0
    expand = clone.args[0]
    if not calls(expand, aten.expand.default) or len(expand.users) != 1:
        return None, 0
    unsqueeze = expand.args[0]
    if not calls(unsqueeze, aten.unsqueeze.default) or unsqueeze.args[1] != 2:
        return None, 0
    source, out = unsqueeze.args[0], value(node)
    x = value(source)
    if x is None or out is None or x.dim() != 4:
        return None, 0
    if not all(type(n) is int for n in (*x.shape, *out.shape)):
        return None, 0  # symbolic sizes: left as they are
    b, heads, n, d = x.shape
    group = out.size(1) // heads if heads else 0
    repeated = [b, heads, group, n, d]
    if list(value(expand).shape) != repeated or list(out.shape) != [b, heads * group, n, d]:
        return None, 0
    return source, group


def _erase_unread(graph: torch.fx.Graph, attention: torch.fx.Node) -> None:
    """``attention``, its results and the repeats only it read: erased by hand, as
    dead-code elimination keeps ops that draw random numbers (flash attention's seeds)."""
    for result in list(attention.users):
        graph.erase_node(result)
    inputs = attention.all_input_nodes
    graph.erase_node(attention)
    stack, erased = list(inputs), set()
    while stack:
        node = stack.pop()
        if node not in erased and not node.users and node.op == "call_function":
            stack.extend(node.all_input_nodes)
            graph.erase_node(node)
            erased.add(node)
