"""Products of one input by several frozen weights, merged into one product on CUDA.

Attention's query, key and value projections (and a gated MLP's gate and up projections)
multiply the same activations by different weights: ``x @ Wq.T``, ``x @ Wk.T``,
``x @ Wv.T``. At a serving size each product is too small to fill the GPU (a Llama
layer's 1024 × 512 key projection of 1024 tokens takes 4.9 µs on an H100, its three
projections 14.9 µs). One product by the weights concatenated, ``x @ cat([Wq, Wk,
Wv]).T``, sliced into its parts, does the same work in one kernel (8.5 µs).

:func:`merged_products` rewrites such siblings of an inference graph: ``mm`` (or
``addmm`` with 1-D biases, concatenated too) of one contiguous input (the same value,
through the same views) by weights that are the graph's unwritten state or a transpose of
it, all laid out alike, and not returned (nor a view of them) by the graph. The
concatenation reads the state alone, so freezing (:mod:`kiln.freezing`) computes it once;
the pipeline keeps the rewrite only where the graph is frozen. The parts are column slices
of the merged product (their rows are strided), and the values of the ops that read them
are computed again for that layout.

Decided per shape: both forms are timed once on the device, each captured in a CUDA graph
(so that the host's launches, three against one, do not count), and the merged one is
kept where it is at least 5 % faster.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch
import torch.fx

import kiln_autograd
from kiln.device_timing import decided_once, device_time
from kiln.graph_edits import (
    FLOAT_DTYPES,
    call,
    calls,
    copy_graph,
    module_of,
    refresh_values,
    returned,
    value,
)

aten = torch.ops.aten
log = logging.getLogger("kiln.products")


def merged_products(
    gm: torch.fx.GraphModule, device_type: str = "cuda"
) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose sibling products on ``device_type`` by frozen weights are
    one product each where that is faster on the device; None where there is none."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    state = {placeholders[i] for i in kiln_autograd.unwritten_state(gm)}
    groups = [g for g in _siblings(gm.graph, state, device_type) if _faster(*_shape(g))]
    if not groups:
        return None
    graph, copies = copy_graph(gm)
    parts = []
    for group in groups:
        parts += _merge(graph, [copies[n] for n in group], state={copies[p] for p in state})
    refresh_values(graph, parts)
    graph.eliminate_dead_code()
    graph.lint()
    return module_of(gm, graph)


def _siblings(graph: torch.fx.Graph, state: set[torch.fx.Node], device_type: str) -> list:
    """Groups of at least two products of one input by state weights, in graph order."""
    found: dict[tuple, list[torch.fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        key = _product_key(node, state, device_type)
        if key is not None:
            found[key].append(node)
    groups = [[n for n in nodes if not returned(n)] for nodes in found.values()]
    return [nodes for nodes in groups if len(nodes) > 1]


def _product_key(node: torch.fx.Node, state: set[torch.fx.Node], device_type: str):
    """What a product shares with its siblings (its op, input, weights' layout, biases'
    presence), or None where it is not a product this merges."""
    if node.kwargs:
        return None
    if not (calls(node, aten.mm.default) and len(node.args) == 2) and not (
        calls(node, aten.addmm.default) and len(node.args) == 3
    ):
        return None
    bias, a, b = _operands(node)
    if bias is not None and not (bias in state and value(bias).dim() == 1):
        return None
    out, weight = value(node), _weight(b, state)
    if (
        out is None
        or weight is None
        or out.device.type != device_type
        or out.dtype not in FLOAT_DTYPES
    ):
        return None
    if not all(type(n) is int for n in (*value(a).shape, *value(b).shape)):
        return None
    if not value(a).is_contiguous():
        return None
    _, transposed = weight
    return (node.target, _same_value(a), transposed, out.dtype)


def _weight(b: object, state: set[torch.fx.Node]) -> tuple[torch.fx.Node, bool] | None:
    """``(state tensor, transposed)`` where ``b`` ([K, N]) is a state tensor or the
    transpose of one ([N, K], contiguous: a ``Linear`` weight), else None."""
    if not isinstance(b, torch.fx.Node):
        return None
    if b in state and value(b).is_contiguous():
        return b, False
    transposes = (b.target is aten.permute.default and list(b.args[1]) == [1, 0]) or (
        b.target is aten.t.default
    )
    base = b.args[0] if b.op == "call_function" and transposes else None
    if base in state and value(base).dim() == 2 and value(base).is_contiguous():
        return base, True
    return None


def _same_value(node: object) -> object:
    """A key equal for nodes that are the same value through the same ``view`` calls
    (each ``F.linear`` of a 3-D input views it anew)."""
    if isinstance(node, torch.fx.Node) and node.target is aten.view.default:
        return (_same_value(node.args[0]), tuple(node.args[1]))
    return node


def _operands(product: torch.fx.Node) -> tuple:
    """``(bias or None, a, b)`` of an ``mm`` or ``addmm``."""
    return (None, *product.args) if product.target is aten.mm.default else tuple(product.args)


def _shape(group: list[torch.fx.Node]) -> tuple:
    first = group[0]
    _, a, _ = _operands(first)
    m, k = value(a).shape
    widths = tuple(value(n).shape[1] for n in group)
    return m, k, widths, value(first).dtype, value(first).device


def _merge(graph: torch.fx.Graph, group: list[torch.fx.Node], state) -> list[torch.fx.Node]:
    """One product in place of ``group``'s, each of them replaced by its slice."""
    first = group[0]
    bias, a, _ = _operands(first)
    weights = [_weight(_operands(n)[2], state) for n in group]
    transposed = weights[0][1]
    with graph.inserting_before(first):
        bases = [w for w, _ in weights]
        if transposed:  # [N_i, K] weights stacked, then viewed as [K, sum N_i]
            stacked = call(graph, aten.cat.default, bases, 0)
            weight = call(graph, aten.permute.default, stacked, [1, 0])
        else:
            weight = call(graph, aten.cat.default, bases, 1)
        if bias is None:
            product = call(graph, aten.mm.default, a, weight)
        else:
            biases = call(graph, aten.cat.default, [_operands(n)[0] for n in group], 0)
            product = call(graph, aten.addmm.default, biases, a, weight)
        parts, start = [], 0
        for node in group:
            width = value(node).shape[1]
            part = call(graph, aten.slice.Tensor, product, 1, start, start + width)
            part.meta = {**node.meta, "val": part.meta["val"]}
            node.replace_all_uses_with(part)
            parts.append(part)
            start += width
    for node in group:
        graph.erase_node(node)
    return parts


@decided_once("merged products")
def _faster(m, k, widths, dtype, device) -> bool | None:
    """Whether one product of width ``sum(widths)`` beats the separate products by 5 %
    on ``device``, each timed from a CUDA graph; timed once per shape."""
    try:
        a = torch.randn(m, k, dtype=dtype, device=device)
        weights = [torch.randn(n, k, dtype=dtype, device=device) for n in widths]
        merged = torch.cat(weights)
        apart = device_time(lambda: [torch.mm(a, w.t()) for w in weights])
        together = device_time(lambda: torch.mm(a, merged.t()))
    except RuntimeError as exc:  # out of memory, say: keep the products as they are
        log.info("could not time merging products %dx%dx%s: %s", m, k, widths, exc)
        return None
    log.info(
        "products %dx%d by %s %s: apart %.1f µs, merged %.1f µs",
        m, k, list(widths), dtype, apart, together,
    )  # fmt: skip
    return together < 0.95 * apart
