"""Depthwise convolutions as sums of shifted products, on CUDA.

A depthwise convolution (as many groups as input and output channels: each channel
filtered by a kernel of its own, MobileNet's and ConvNeXt's) is, for each of the kernel's
``kh·kw`` taps, a strided view of the (padded) input times that tap's weight per channel,
and the sum of those products: pointwise work that Kiln fuses into one kernel, with the
bias and what follows. cuDNN runs channels-last depthwise convolutions with kernels it
compiles at the first call of each shape in each process (0.17-0.25 s per shape on an
H200, bf16): MobileNetV3's first eager call in channels-last took 2.7 s (0.6 s
channels-first), and Kiln's warm start paid it every time. As sums, MobileNetV3's
inference (batch 8, bf16, H200) starts warm in 2.5 s instead of 5.4 s, and keeps the GPU
busy 428 µs a call against 439 µs with cuDNN's. Cold, it compiles in about the same time
(the sums' kernels are compiled instead).

:func:`depthwise_as_sums` rewrites such 2-D convolutions (not transposed, one weight per
output channel, at most ``MAX_TAPS`` taps, sizes known) of a forward graph. The products
and the sum are computed in float32 (each tap read and converted in the kernel, as cuDNN
accumulates), then rounded to the convolution's dtype once. The result keeps the
convolution's layout where the graph returns it or a view of it cannot take another (a
training forward's saved tensors among them); elsewhere it takes the input's.
"""

from __future__ import annotations

import torch
import torch.fx

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
# a 5 x 5 kernel, MobileNet's largest. ConvNeXt's 7 x 7 ones (49 taps) took 20 % more
# GPU time as sums than cuDNN's kernels on an H200, and compiled for seconds
MAX_TAPS = 25


def depthwise_as_sums(
    gm: torch.fx.GraphModule, device_type: str = "cuda"
) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose depthwise convolutions on ``device_type`` are sums of shifted
    products; None where it has none."""
    found = [n for n in gm.graph.nodes if is_depthwise(n, device_type)]
    if not found:
        return None
    try:
        return _rewritten(gm, found, keep_layout=False)
    except RuntimeError:  # a view of the result cannot take the input's layout
        return _rewritten(gm, found, keep_layout=True)


def is_depthwise(node: torch.fx.Node, device_type: str) -> bool:
    """Whether ``node`` is a 2-D depthwise convolution this module rewrites."""
    values = conv2d_values(node, device_type)
    if values is None:
        return False
    x_val, w_val, out = values
    bias, output_padding, groups = node.args[2], node.args[7], node.args[8]
    if any(output_padding):
        return False
    if not all(type(n) is int for n in (*x_val.shape, *w_val.shape, *out.shape)):
        return False
    channels, per_group, kh, kw = w_val.shape
    return (
        groups == x_val.shape[1] == channels
        and per_group == 1
        and kh * kw <= MAX_TAPS
        and (bias is None or value(bias) is not None)
        and _memory_format(out) is not None
    )


def _rewritten(gm: torch.fx.GraphModule, convs: list[torch.fx.Node], keep_layout: bool):
    graph, copies = copy_graph(gm)
    changed = [_as_sum(graph, copies[n], keep_layout or returned(n)) for n in convs]
    refresh_values(graph, changed)
    graph.lint()
    return module_of(gm, graph)


def _as_sum(graph: torch.fx.Graph, conv: torch.fx.Node, keep_layout: bool) -> torch.fx.Node:
    """The sum computing ``conv``, in its place; returns the node that replaced it."""
    x, w, bias, stride, padding, dilation = conv.args[:6]
    _, _, kh, kw = value(w).shape
    _, _, out_h, out_w = value(conv).shape
    with graph.inserting_before(conv):
        if any(padding):
            pad_h, pad_w = padding
            x = call(graph, aten.constant_pad_nd.default, x, [pad_w, pad_w, pad_h, pad_h], 0.0)
        x = _in_float32(graph, x)
        taps = call(graph, aten.permute.default, _in_float32(graph, w), [2, 3, 1, 0])
        taps = call(graph, aten.unsqueeze.default, taps, 4)
        taps = call(graph, aten.unsqueeze.default, taps, 5)  # [kh, kw, 1, C, 1, 1]
        total = None
        for i in range(kh):
            rows = _strided(graph, x, 2, i * dilation[0], out_h, stride[0])
            row_taps = call(graph, aten.select.int, taps, 0, i)
            for j in range(kw):
                shifted = _strided(graph, rows, 3, j * dilation[1], out_w, stride[1])
                tap = call(graph, aten.select.int, row_taps, 0, j)
                product = call(graph, aten.mul.Tensor, shifted, tap)
                total = product if total is None else call(graph, aten.add.Tensor, total, product)
        if bias is not None:
            total = call(graph, aten.add.Tensor, total, _per_channel(graph, bias))
        out = total
        if value(conv).dtype != torch.float32:  # rounded once
            out = call(graph, aten._to_copy.default, total, dtype=value(conv).dtype)
        if keep_layout and value(out).stride() != value(conv).stride():
            layout = _memory_format(value(conv))
            out = call(graph, aten.clone.default, out, memory_format=layout)
    out.meta = {**conv.meta, "val": out.meta["val"]}
    conv.replace_all_uses_with(out)
    graph.erase_node(conv)
    return out


def _strided(graph: torch.fx.Graph, x, dim: int, start: int, count: int, step: int):
    """``count`` positions of ``x`` along ``dim``, from ``start``, ``step`` apart."""
    return call(graph, aten.slice.Tensor, x, dim, start, start + (count - 1) * step + 1, step)


def _per_channel(graph: torch.fx.Graph, values):
    """A value per channel (``[C]``) as a ``[1, C, 1, 1]`` float32 tensor that broadcasts
    over the batch and the image."""
    values = _in_float32(graph, values)
    for dim in (0, 2, 3):
        values = call(graph, aten.unsqueeze.default, values, dim)
    return values


def _in_float32(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node:
    """``node``'s value in float32 (``node`` itself where it is already)."""
    if value(node).dtype == torch.float32:
        return node
    return call(graph, aten._to_copy.default, node, dtype=torch.float32)


def _memory_format(t: torch.Tensor) -> torch.memory_format | None:
    if t.is_contiguous():
        return torch.contiguous_format
    if t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return None
