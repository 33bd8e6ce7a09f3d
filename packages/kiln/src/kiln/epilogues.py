"""A tanh-approximated GELU after a matrix product, applied by the product's epilogue.

``gelu(addmm(bias, x, w), approximate="tanh")`` — called as ``F.gelu`` or written out as
GPT-2 writes it, ``0.5 * v * (1 + tanh(√(2/π) * (v + 0.044715 * v ** 3)))`` — becomes one
``aten._addmm_activation(bias, x, w, use_gelu=True)``: cuBLASLt adds the bias and applies
the GELU to the product before rounding and storing it, so the activation costs no kernel
and no round trip of the product through memory (its own kernel took a tenth of GPT-2's
GPU time). The result is eager's within one rounding: eager rounds the product and every
step of a written-out GELU to the output dtype, the epilogue rounds once. Where cuBLASLt
cannot take the operands, ATen computes the same ``addmm`` and then a ``gelu``.

Only where the product's own value is read by nothing else (a training forward that saves
it for the backward keeps it), on CUDA. The exact GELU (``erf``) has no such epilogue.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from kiln.graph_edits import FLOAT_DTYPES, call, calls, copy_graph, module_of, value

aten = torch.ops.aten
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def gelu_epilogues(
    gm: torch.fx.GraphModule, device_type: str = "cuda"
) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose products on ``device_type`` followed by a tanh GELU compute
    it in their epilogue; None where there is none."""
    found = {}
    for node in gm.graph.nodes:
        v = tanh_gelu_input(node)
        if v is not None and (product := _product(v, node, device_type)) is not None:
            found[node] = product
    if not found:
        return None
    graph, copies = copy_graph(gm)
    for gelu, (product, view) in found.items():
        _fuse(graph, copies[gelu], copies[product], copies[view] if view else None)
    graph.lint()
    return module_of(gm, graph)


def tanh_gelu_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """``v`` where ``node`` computes the tanh GELU of ``v`` (``aten.gelu`` or written
    out), else None."""
    if calls(node, aten.gelu.default):
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "")
        return node.args[0] if approximate == "tanh" else None
    if not calls(node, aten.mul.Tensor):
        return None
    for half, one_plus_tanh in _both_orders(*node.args):
        v = _scaled(half, 0.5)
        tanh = _shifted(one_plus_tanh, 1.0)
        if v is None or tanh is None or not calls(tanh, aten.tanh.default):
            continue
        inner = _scaled(tanh.args[0], SQRT_2_OVER_PI)
        if inner is not None and _cubic_term_added(inner, v):
            return v
    return None


def _cubic_term_added(node: torch.fx.Node, v: torch.fx.Node) -> bool:
    """Whether ``node`` is ``v + 0.044715 * v ** 3``."""
    if not calls(node, aten.add.Tensor) or len(node.args) != 2 or node.kwargs:
        return False
    for term, other in _both_orders(*node.args):
        cube = _scaled(term, 0.044715)
        if other is v and calls(cube, aten.pow.Tensor_Scalar) and cube.args == (v, 3):  # 3 or 3.0
            return True
    return False


def _product(
    v: torch.fx.Node, gelu: torch.fx.Node, device_type: str
) -> tuple[torch.fx.Node, object] | None:
    """``(addmm, view or None)`` where ``v`` is an ``addmm`` the epilogue can take (or a
    view of one) and nothing but the GELU reads it or the GELU's steps."""
    part = _gelu_nodes(gelu, v)
    if not all(_read_only_by(n, part) for n in (v, *part) if n is not gelu):
        return None
    view = None
    if calls(v, aten.view.default):
        view, v = v, v.args[0]
        if not _read_only_by(v, {view}):
            return None
    if not calls(v, aten.addmm.default) or v.kwargs or len(v.args) != 3:
        return None
    bias, a, b, out = (value(x) for x in (*v.args, v))
    if out is None or bias is None or a is None or b is None:
        return None
    if out.device.type != device_type or out.dtype not in FLOAT_DTYPES or bias.dim() != 1:
        return None
    return v, view


def _read_only_by(node: torch.fx.Node, readers: set[torch.fx.Node]) -> bool:
    return all(user in readers for user in node.users)


def _gelu_nodes(gelu: torch.fx.Node, v: torch.fx.Node) -> set[torch.fx.Node]:
    """The nodes from ``v`` (excluded) to ``gelu`` (included)."""
    seen: set[torch.fx.Node] = set()
    stack = [gelu]
    while stack:
        node = stack.pop()
        if node is v or node in seen:
            continue
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return seen


def _fuse(graph: torch.fx.Graph, gelu, product, view) -> None:
    bias, a, b = product.args
    with graph.inserting_before(gelu):
        fused = call(graph, aten._addmm_activation.default, bias, a, b, use_gelu=True)
        if view is not None:
            fused = call(graph, aten.view.default, fused, view.args[1])
    gelu.replace_all_uses_with(fused)
    dead = _gelu_nodes(gelu, product) | {product}
    for node in reversed(list(graph.nodes)):  # readers before what they read
        if node in dead and not node.users:
            graph.erase_node(node)


def _both_orders(first: object, second: object):
    yield first, second
    yield second, first


def _scaled(node: object, factor: float) -> torch.fx.Node | None:
    """``x`` where ``node`` is ``x * factor`` (either order), else None."""
    if not calls(node, aten.mul.Tensor) or len(node.args) != 2:
        return None
    for x, number in _both_orders(*node.args):
        if isinstance(x, torch.fx.Node) and _is_number(number, factor):
            return x
    return None


def _shifted(node: object, term: float) -> torch.fx.Node | None:
    """``x`` where ``node`` is ``x + term`` (either order), else None."""
    if not calls(node, aten.add.Tensor) or len(node.args) != 2 or node.kwargs:
        return None
    for x, number in _both_orders(*node.args):
        if isinstance(x, torch.fx.Node) and _is_number(number, term):
            return x
    return None


def _is_number(x: object, wanted: float) -> bool:
    return type(x) in (int, float) and abs(x - wanted) <= 1e-7 * max(1.0, abs(wanted))
