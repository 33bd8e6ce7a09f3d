"""Convolutions whose kernel tiles the image (stride = kernel size) as matrix products, on CUDA.

A vision transformer's patch embedding is a convolution with a 16 × 16 kernel and a stride
of 16 over 3 channels: each output pixel reads its own patch, no two patches overlap. As
a matrix product it is ``patches @ weight.T`` with ``patches`` the image cut into rows of
``C·kh·kw`` values, but cuDNN runs it as a convolution, with a padding kernel for the 3
channels: 82 µs a call for ViT-B/16 at batch 8 on an H100, where the product takes a few.

:func:`patch_convolutions` rewrites such a 2-D convolution (a kernel larger than 1 × 1,
which cuDNN already runs as a product; no padding, no dilation, one group, not transposed,
sizes known, no batch norm after it, which freezing folds into it) to: a view of the input as
``[B, C, Ho, kh, Wo, kw]`` (the rows and columns past the last whole patch left out, as the
convolution leaves them), permuted to ``[B, Ho, Wo, C, kh, kw]`` and copied to a
``[B·Ho·Wo, C·kh·kw]`` matrix; an ``mm`` (``addmm`` with a bias) by the weight viewed as
``[C·kh·kw, Cout]``; the result viewed as ``[B, Cout, Ho, Wo]`` with channels-last strides,
which the ops that read it take as they are (their values are computed again for that
layout). Where an op reading it cannot take that layout, the result is copied to the
convolution's own layout instead (contiguous; a channels-last convolution's is the
product's). A convolution the graph returns, or a view of it, keeps its own layout that
way too: that covers a training forward's saved tensors, which its backward reads with
the strides it was traced with.

Decided per shape: both forms are timed once on the device (:mod:`kiln.device_timing`),
the product with the copy of the patches, and the product is kept where it is at least 10 %
faster.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

from kiln import folding
from kiln.device_timing import decided_once, device_time
from kiln.graph_edits import (
    call,
    conv2d_values,
    copy_graph,
    module_of,
    refresh_values,
    returned,
    value,
)

aten = torch.ops.aten
log = logging.getLogger("kiln.convolutions")


def patch_convolutions(
    gm: torch.fx.GraphModule, device_type: str = "cuda"
) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose non-overlapping convolutions on ``device_type`` are matrix
    products where that is faster on the device; None where there is none."""
    found = [n for n in gm.graph.nodes if _patch_conv(n, device_type) and _faster(*_shape(n))]
    if not found:
        return None
    try:
        return _rewritten(gm, found, keep_layout=False)
    except RuntimeError:  # a reader of the result cannot take the channels-last layout
        return _rewritten(gm, found, keep_layout=True)


def _rewritten(gm: torch.fx.GraphModule, convs: list[torch.fx.Node], keep_layout: bool):
    graph, copies = copy_graph(gm)
    changed = [_as_product(graph, copies[n], keep_layout or returned(n)) for n in convs]
    refresh_values(graph, changed)
    graph.lint()
    return module_of(gm, graph)


def _patch_conv(node: torch.fx.Node, device_type: str) -> bool:
    """Whether ``node`` is a 2-D convolution whose kernel tiles its input."""
    values = conv2d_values(node, device_type)
    if values is None:
        return False
    x_val, w_val, out = values
    bias, stride, padding, dilation, _, _, groups = node.args[2:]
    if groups != 1:
        return False
    if not all(type(n) is int for n in (*x_val.shape, *w_val.shape)):
        return False
    if any(user.target is folding.BATCH_NORM for user in node.users):
        return False  # freezing folds the batch norm into the convolution
    return (
        list(stride) == list(w_val.shape[2:])
        and w_val.shape[2] * w_val.shape[3] > 1  # a 1 x 1 convolution is cuDNN's product
        and all(p == 0 for p in padding)
        and all(d == 1 for d in dilation)
        and w_val.is_contiguous()
        and (bias is None or value(bias).dim() == 1)
        and (out.is_contiguous() or out.is_contiguous(memory_format=torch.channels_last))
    )


def _shape(conv: torch.fx.Node) -> tuple:
    x, w = value(conv.args[0]), value(conv.args[1])
    return tuple(x.shape), x.stride(), tuple(w.shape), conv.args[2] is not None, x.dtype, x.device


def _as_product(graph: torch.fx.Graph, conv: torch.fx.Node, keep_layout: bool) -> torch.fx.Node:
    """The product computing ``conv``, in its place; returns the node that replaced it."""
    x, w, bias = conv.args[:3]
    (b, c, h, width), (c_out, _, kh, kw) = value(x).shape, value(w).shape
    ho, wo = h // kh, width // kw
    with graph.inserting_before(conv):
        patches = _patches(graph, x, (b, c, h, width), (ho, wo, kh, kw))
        weight = call(graph, aten.view.default, w, [c_out, c * kh * kw])
        weight = call(graph, aten.permute.default, weight, [1, 0])
        if bias is None:
            product = call(graph, aten.mm.default, patches, weight)
        else:
            product = call(graph, aten.addmm.default, bias, patches, weight)
        out = call(graph, aten.view.default, product, [b, ho, wo, c_out])
        out = call(graph, aten.permute.default, out, [0, 3, 1, 2])  # channels-last
        if keep_layout and value(out).stride() != value(conv).stride():
            out = call(graph, aten.clone.default, out, memory_format=torch.contiguous_format)
    out.meta = {**conv.meta, "val": out.meta["val"]}
    conv.replace_all_uses_with(out)
    graph.erase_node(conv)
    return out


def _patches(graph: torch.fx.Graph, x, size: tuple, tiles: tuple) -> torch.fx.Node:
    """``x`` ([B, C, H, W]) as a [B·Ho·Wo, C·kh·kw] matrix of its patches, in rows."""
    (b, c, h, width), (ho, wo, kh, kw) = size, tiles
    if ho * kh != h:
        x = call(graph, aten.slice.Tensor, x, 2, 0, ho * kh)
    if wo * kw != width:
        x = call(graph, aten.slice.Tensor, x, 3, 0, wo * kw)
    tiled = call(graph, aten.view.default, x, [b, c, ho, kh, wo, kw])
    tiled = call(graph, aten.permute.default, tiled, [0, 2, 4, 1, 3, 5])
    rows = call(graph, aten.clone.default, tiled, memory_format=torch.contiguous_format)
    return call(graph, aten.view.default, rows, [b * ho * wo, c * kh * kw])


@decided_once("convolutions as products")
def _faster(x_shape, x_stride, w_shape, has_bias, dtype, device) -> bool | None:
    """Whether the product (with its copy of the patches) beats the convolution by 10 %
    on ``device``, each timed from a CUDA graph; timed once per shape."""
    (b, _, h, width), (c_out, _, kh, kw) = x_shape, w_shape
    ho, wo = h // kh, width // kw
    try:
        x = torch.empty_strided(x_shape, x_stride, dtype=dtype, device=device).normal_()
        w = torch.randn(w_shape, dtype=dtype, device=device)
        bias = torch.randn(c_out, dtype=dtype, device=device) if has_bias else None
        conv = device_time(lambda: torch.nn.functional.conv2d(x, w, bias, stride=(kh, kw)))
        weight = w.view(c_out, -1).t()

        def product():
            tiles = x[:, :, : ho * kh, : wo * kw].unflatten(3, (wo, kw)).unflatten(2, (ho, kh))
            rows = tiles.permute(0, 2, 4, 1, 3, 5).contiguous().view(b * ho * wo, -1)
            return torch.mm(rows, weight) if bias is None else torch.addmm(bias, rows, weight)

        as_product = device_time(product)
    except RuntimeError as exc:  # out of memory, say: keep the convolution
        log.info("could not time convolution %s by %s: %s", x_shape, w_shape, exc)
        return None
    log.info(
        "convolution %s by %s %s: %.1f µs, as a product %.1f µs",
        x_shape, w_shape, dtype, conv, as_product,
    )  # fmt: skip
    return as_product < 0.9 * conv
