"""A ReLU after a convolution (and after a residual added to it), applied by cuDNN.

In a ResNet frozen for inference each batch norm is folded into the convolution before it
(:mod:`kiln.folding`), which leaves ``relu(convolution(x, w, b))`` and, at the end of a
block, ``relu(convolution(x, w, b) + residual)``. Compiled as written, the convolution
writes its output and a kernel of Kiln's reads it back to add the bias (and the residual)
and apply the ReLU: ResNet-50 at batch 8 ran 47 such kernels, 154 µs a call on an H100.
:func:`relu_epilogues` makes each one ``kiln_loopir::convolution_relu``, which cuDNN's
fused convolution computes in the convolution's epilogue.

Where: a 2-D convolution on ``device_type`` (one dtype, not transposed, sizes known) whose
value only the ReLU reads, or only the addition of a residual of its own shape and dtype
that only the ReLU reads; the ReLU's layout is the op's. A bias is taken where it is
float32, the type cuDNN's fused forms read it in: a float32 model's, or the float32 shift a
batch norm folded into a bfloat16 convolution leaves (added in float32, then rounded to
bfloat16; the fused op rounds the same sum once). A bfloat16 bias keeps its ReLU apart.

Decided per shape: the fused convolution and the convolution alone are timed on the device
once per shape and machine (:mod:`kiln.device_timing`, which keeps the decision in the
cache), and the fused one is kept where it takes at most 5 % longer
than the convolution alone (any kernel of its own that reads and writes the output back
costs more), where cuDNN lays the output out as the ReLU's (kiln-loopir then calls the ATen
op itself, with no copy). On an H100 (cuDNN 9, bfloat16) none of ResNet-50's shapes at batch
8 passes: the fused form took 1.3-4x the convolution's time (11.7 against 46.5 µs at the
last stage's 3 x 3), so Kiln's own kernel after the convolution stays. The same random
inputs check the fused values against the convolution's, with the bias, residual and ReLU
added after it, within two roundings: a shape where they differ is kept apart.

Kiln's pipeline runs this rewrite only with ``mode="max-autotune"``: cuDNN builds each
fused form at its first call, about a second per shape (ResNet-50's warm start spent 13 s
timing them on an H200).
"""

from __future__ import annotations

import logging

import torch
import torch.fx

from kiln.device_timing import decided_once, device_time
from kiln.graph_edits import call, calls, conv2d_values, copy_graph, module_of, value
from kiln_loopir import CONVOLUTION_RELU
from kiln_loopir.convolution_relu import cudnn_call

aten = torch.ops.aten
RELU = aten.relu.default
TO_COPY = aten._to_copy.default
ADD = aten.add.Tensor
log = logging.getLogger("kiln.convolutions")


def relu_epilogues(
    gm: torch.fx.GraphModule, device_type: str = "cuda"
) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose ReLUs after convolutions on ``device_type`` are applied by the
    convolution where that costs no time on the device; None where there is none."""
    found = []
    for relu in gm.graph.find_nodes(op="call_function", target=RELU):
        match = _match(relu, device_type)
        if match is not None and _free(*_shape(*match[:3], relu)):
            found.append(match)
    if not found:
        return None
    graph, copies = copy_graph(gm)
    for conv, bias, residual, replaced in found:
        _fuse(graph, *(copies[n] if n is not None else None for n in (conv, bias, residual)),
              [copies[n] for n in replaced])  # fmt: skip
    graph.lint()
    return module_of(gm, graph)


def _match(relu: torch.fx.Node, device_type: str):
    """``(convolution, bias or None, residual or None, nodes replaced)`` whose sum
    ``relu`` takes, or None."""
    source = relu.args[0]
    found = _with_bias(source, device_type)
    residual = None
    if found is None and _plain_add(source):
        for chain, other in (source.args[:2], source.args[1::-1]):
            found = _with_bias(chain, device_type)
            if found is not None:
                residual = other
                break
        out = value(source)
        r = value(residual) if isinstance(residual, torch.fx.Node) else None
        if r is None or out is None or r.shape != out.shape or r.dtype != out.dtype:
            return None
    if found is None:
        return None
    conv, bias, replaced = found
    out, conv_val = value(relu), value(conv)
    if out is None or out.dtype != conv_val.dtype or out.shape != conv_val.shape:
        return None
    return conv, bias, residual, [relu] + ([source] if residual is not None else []) + replaced


def _with_bias(node, device_type: str):
    """``(convolution, bias or None, nodes)`` where ``node`` is a convolution read only
    here (a bias of its own float32), or such a convolution with no bias of its own plus a
    float32 bias per channel: in the convolution's own dtype, or in float32 and then
    rounded to the convolution's (as a batch norm folded into a bfloat16 convolution leaves
    it). cuDNN's fused forms read a float32 bias."""
    if _convolution(node, device_type):
        bias = node.args[2]
        if len(node.users) != 1 or (bias is not None and value(bias).dtype != torch.float32):
            return None
        return node, bias, [node]
    rounded = node if _rounding(node) else None
    added = node if rounded is None else node.args[0]
    if not _plain_add(added):
        return None
    for conv, bias in (added.args[:2], added.args[1::-1]):
        if not _convolution(conv, device_type) or len(conv.users) != 1 or conv.args[2]:
            continue
        b, out = value(bias) if isinstance(bias, torch.fx.Node) else None, value(conv)
        if b is None or b.dtype != torch.float32:
            continue
        if value(node).dtype != out.dtype:  # a float32 sum of a narrower convolution, unrounded
            continue
        per_channel = (out.shape[1], 1, 1)
        if tuple(b.shape)[-3:] == per_channel and (
            b.dim() == 3 or (b.dim() == 4 and b.shape[0] == 1)
        ):
            return conv, bias, [*(n for n in (rounded,) if n is not None), added, conv]
    return None


def _rounding(node) -> bool:
    """Whether ``node`` only converts a value to another dtype, and only one node reads it."""
    return (
        calls(node, TO_COPY)
        and len(node.args) == 1
        and set(node.kwargs) == {"dtype"}
        and len(node.users) == 1
    )


def _plain_add(node) -> bool:
    """Whether ``node`` adds two tensors (no scaling) and only one node reads it."""
    return (
        calls(node, ADD)
        and len(node.args) == 2
        and node.kwargs.get("alpha", 1) == 1
        and len(node.users) == 1
    )


def _convolution(node, device_type: str) -> bool:
    """Whether ``node`` is a 2-D convolution cuDNN's fused form takes."""
    values = conv2d_values(node, device_type)
    if values is None:
        return False
    x_val, w_val, out = values
    bias = node.args[2]
    if any(t.dtype != out.dtype for t in (x_val, w_val)):
        return False
    if bias is not None and (value(bias) is None or value(bias).dtype != out.dtype):
        return False
    return all(type(n) is int for n in (*x_val.shape, *w_val.shape, *x_val.stride()))


def _shape(conv: torch.fx.Node, bias, residual, relu: torch.fx.Node) -> tuple:
    x, w, _, stride, padding, dilation, _, _, groups = conv.args
    x_val, w_val = value(x), value(w)
    return (
        tuple(x_val.shape), x_val.stride(), tuple(w_val.shape), w_val.stride(),
        bias is not None, residual is not None, tuple(stride), tuple(padding),
        tuple(dilation), groups, value(relu).stride(), x_val.dtype, x_val.device,
    )  # fmt: skip


def _fuse(graph: torch.fx.Graph, conv, bias, residual, replaced: list) -> None:
    """``kiln_loopir::convolution_relu`` in place of ``replaced`` (the ReLU first, then
    what it read, the convolution last)."""
    relu = replaced[0]
    x, w, _, stride, padding, dilation, _, _, groups = conv.args
    out_stride = list(value(relu).stride())
    with graph.inserting_before(relu):
        if bias is not None and value(bias).dim() != 1:
            bias = call(graph, aten.view.default, bias, [-1])
        fused = call(graph, CONVOLUTION_RELU, x, w, bias, residual, list(stride),
                     list(padding), list(dilation), groups, out_stride)  # fmt: skip
    fused.meta = {**relu.meta, "val": fused.meta["val"]}
    relu.replace_all_uses_with(fused)
    for node in replaced:
        graph.erase_node(node)


@decided_once("ReLU epilogues of convolutions")
def _free(x_shape, x_stride, w_shape, w_stride, has_bias, has_residual, stride, padding,
          dilation, groups, out_stride, dtype, device) -> bool | None:  # fmt: skip
    """Whether cuDNN's fused convolution lays its output out as ``out_stride`` (the layout
    kiln-loopir then calls it for, with no copy), gives the convolution's values plus the
    bias (and residual) after a ReLU on random inputs, and takes at most 5 % longer than
    the convolution alone on ``device``, each timed from a CUDA graph; once per shape."""
    try:
        x = torch.empty_strided(x_shape, x_stride, dtype=dtype, device=device).normal_()
        w = torch.empty_strided(w_shape, w_stride, dtype=dtype, device=device).normal_()
        w = w / (w[0].numel() ** 0.5)
        c_out = w_shape[0]
        bias = torch.randn(c_out, device=device) if has_bias else None  # float32
        args = (list(stride), list(padding), list(dilation))

        def alone():
            return aten.convolution(x, w, None, *args, False, [0, 0], groups)

        out = alone()
        residual = torch.randn_like(out) if has_residual else None

        op, fused_args = cudnn_call(x, w, bias, residual, *args, groups)

        def fused():
            return op(*fused_args)

        got = fused()
        if got.stride() != tuple(out_stride):
            log.info("fused convolution %s by %s lays its output out otherwise", x_shape, w_shape)
            return False
        summed = out if bias is None else (out.float() + bias.view(-1, 1, 1)).to(dtype)
        want = torch.relu(summed.float() + (residual.float() if has_residual else 0))
        error = (got.float() - want).abs().max().item()
        if error > 2 * _ulp(dtype) * (want.abs().max().item() + 1):
            log.info("fused convolution %s by %s is off by %g: kept apart", x_shape, w_shape, error)
            return False
        alone_us, fused_us = device_time(alone), device_time(fused)
    except RuntimeError as exc:  # cuDNN has no fused form for these, say: keep them apart
        log.info("could not time convolution %s by %s with its ReLU: %s", x_shape, w_shape, exc)
        return None
    log.info(
        "convolution %s by %s %s: %.1f µs, with its ReLU%s %.1f µs",
        x_shape, w_shape, dtype, alone_us, " and residual" if has_residual else "", fused_us,
    )  # fmt: skip
    return fused_us <= 1.05 * alone_us


def _ulp(dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers at 1 (one rounding of a value near 1), or TF32's
    for float32, whose convolutions cuDNN may compute in TF32."""
    return {torch.bfloat16: 2**-7, torch.float16: 2**-10}.get(dtype, 2**-10)
