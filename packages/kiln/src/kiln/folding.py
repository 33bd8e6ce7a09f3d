"""Rewrites of an inference graph that turn per-call work into work on its state alone.

Both run on an aten graph before :mod:`kiln.freezing` splits off what depends only on the
state (parameters and buffers the graph reads and never writes), so what they add is
computed once, not at every call:

- :func:`fold_batch_norms`: a batch norm in evaluation mode right after a convolution is
  an affine map per output channel, so it folds into the convolution's weight and bias
  (computed in float32, then cast to the weight's dtype);
- :func:`lay_out_weights`: a convolution whose input is channels-last reads a weight laid
  out the same way, which cuDNN would otherwise convert at every call.

:func:`biases_after_convolutions` applies to any forward graph on CUDA: ATen adds a
convolution's bias after cuDNN in a kernel of its own, which as an addition in the graph
fuses into the kernel that reads the convolution's output.
"""

from __future__ import annotations

import operator
from collections.abc import Collection

import torch
import torch.fx

from kiln.graph_edits import call, computed_from, copy_graph, module_of, value

aten = torch.ops.aten
CONVOLUTION = aten.convolution.default
BATCH_NORM = aten._native_batch_norm_legit_no_training.default


def fold_batch_norms(graph: torch.fx.Graph, state: Collection[torch.fx.Node]) -> int:
    """Fold each evaluation-mode batch norm whose input is a convolution (used by nothing
    else) into that convolution, where the weights, bias and statistics are all ``state``.
    Returns how many were folded."""
    folded = 0
    for norm in list(graph.find_nodes(op="call_function", target=BATCH_NORM)):
        conv = norm.args[0]
        if _foldable(conv, norm, state):
            _fold(graph, conv, norm)
            folded += 1
    return folded


def lay_out_weights(graph: torch.fx.Graph, state: Collection[torch.fx.Node]) -> int:
    """Give each 2-D convolution whose input is channels-last (and whose weight is
    ``state``, or computed from it) a channels-last weight. Returns how many."""
    changed = 0
    for conv in list(graph.find_nodes(op="call_function", target=CONVOLUTION)):
        x, weight = conv.args[0], conv.args[1]
        x_val, w_val = value(x), value(weight)
        if x_val is None or w_val is None or x_val.dim() != 4 or w_val.dim() != 4:
            continue
        if not _channels_last(x_val) or w_val.is_contiguous(memory_format=torch.channels_last):
            continue
        if not computed_from(weight, state):
            continue
        with graph.inserting_before(conv):
            laid_out = call(graph, aten.clone.default, weight, memory_format=torch.channels_last)
        conv.replace_input_with(weight, laid_out)
        changed += 1
    return changed


def biases_after_convolutions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose convolutions with a bias run without it, followed by
    ``+ bias`` (per channel); None where there is none. (For graphs on CUDA: on the CPU,
    oneDNN adds the bias inside the convolution.)"""
    convs = [
        n
        for n in gm.graph.find_nodes(op="call_function", target=CONVOLUTION)
        if n.args[2] is not None and value(n) is not None
    ]
    if not convs:
        return None
    graph, copies = copy_graph(gm)
    for conv in (copies[n] for n in convs):
        bias, ndim = conv.args[2], value(conv).dim()
        conv.update_arg(2, None)
        with graph.inserting_after(conv):
            per_channel = call(graph, aten.view.default, bias, [-1] + [1] * (ndim - 2))
        with graph.inserting_after(per_channel):
            biased = call(graph, aten.add.Tensor, conv, per_channel)
        conv.replace_all_uses_with(biased, delete_user_cb=lambda user, b=biased: user is not b)
    return module_of(gm, graph)


# --- batch norm --------------------------------------------------------------------------


def _foldable(conv: object, norm: torch.fx.Node, state: Collection[torch.fx.Node]) -> bool:
    if not isinstance(conv, torch.fx.Node) or conv.target is not CONVOLUTION:
        return False
    if set(conv.users) != {norm} or conv.args[6]:  # used elsewhere, or transposed
        return False
    if any(user.target is not operator.getitem or user.args[1] != 0 for user in norm.users):
        return False  # the batch's statistics (empty in evaluation mode) are read
    weight, bias = conv.args[1], conv.args[2]
    gamma, beta, mean, var = norm.args[1:5]
    given = [weight, mean, var, *(x for x in (bias, gamma, beta) if x is not None)]
    out = value(conv)
    return (
        out is not None
        and out.is_floating_point()
        and all(isinstance(x, torch.fx.Node) and x in state for x in given)
    )


def _fold(graph: torch.fx.Graph, conv: torch.fx.Node, norm: torch.fx.Node) -> None:
    """``conv`` with weight ``W·s`` and no bias, then ``+ (b - mean)·s + beta`` (float32,
    rounded once, as eager's batch norm does), where ``s = gamma / sqrt(var + eps)``, in
    place of ``norm``'s result. The addition fuses into the kernel after it; a bias given to
    the convolution is a kernel of its own on CUDA (ATen adds it after cuDNN)."""
    weight, bias = conv.args[1], conv.args[2]
    gamma, beta, mean, var, _momentum, eps = norm.args[1:7]
    dtype = value(weight).dtype
    with graph.inserting_before(conv):
        scale = call(graph, aten.rsqrt.default, call(graph, aten.add.Tensor, _f32(graph, var), eps))
        if gamma is not None:
            scale = call(graph, aten.mul.Tensor, _f32(graph, gamma), scale)
        ndim = value(weight).dim()
        new_weight = call(
            graph,
            aten.mul.Tensor,
            _f32(graph, weight),
            call(graph, aten.view.default, scale, [-1] + [1] * (ndim - 1)),
        )
        if bias is None:
            centred = call(graph, aten.neg.default, _f32(graph, mean))
        else:
            centred = call(graph, aten.sub.Tensor, _f32(graph, bias), _f32(graph, mean))
        shift = call(graph, aten.mul.Tensor, centred, scale)
        if beta is not None:
            shift = call(graph, aten.add.Tensor, shift, _f32(graph, beta))
        args = list(conv.args)
        args[1], args[2] = _cast(graph, new_weight, dtype), None
    with graph.inserting_after(conv):
        folded = call(graph, CONVOLUTION, *args)
    folded.meta = {**conv.meta, "val": folded.meta["val"]}
    with graph.inserting_after(folded):
        per_channel = call(graph, aten.view.default, shift, [-1] + [1] * (ndim - 2))
    with graph.inserting_after(per_channel):
        shifted = call(graph, aten.add.Tensor, folded, per_channel)
    with graph.inserting_after(shifted):
        result = _cast(graph, shifted, value(folded).dtype)
    for user in list(norm.users):
        user.replace_all_uses_with(result)
        graph.erase_node(user)
    graph.erase_node(norm)
    graph.erase_node(conv)


# --- helpers -------------------------------------------------------------------------------


def _channels_last(val: torch.Tensor) -> bool:
    return val.is_contiguous(memory_format=torch.channels_last) and not val.is_contiguous()


def _f32(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node:
    return _cast(graph, node, torch.float32)


def _cast(graph: torch.fx.Graph, node: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    if value(node).dtype == dtype:
        return node
    return call(graph, aten._to_copy.default, node, dtype=dtype)
