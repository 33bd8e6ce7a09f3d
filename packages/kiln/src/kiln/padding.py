"""Matrix products whose sizes cuBLAS handles badly, padded where that is faster.

A 16-bit product whose output rows (``N``) or reduced dimension (``K``) are not a multiple
of 8 elements has rows that are not 16-byte aligned, and cuBLAS falls back to slow
kernels: GPT-2's language-model head (``N`` = 50257 words) runs several times slower
than the same product at ``N`` = 50264. :func:`padded_products` rewrites such an
``mm``/``addmm`` on CUDA to pad its operands with zeros to the next multiple of 8, multiply,
and slice the result back (then make it contiguous, as eager's result is; where a
pointwise kernel reads it, that copy fuses into the kernel).

Whether it pays is decided per shape, dtype and device: both forms are timed once on the
device (random operands with the graph's layouts) and the faster one is kept, for the
rest of the process. In an inference graph a padded weight is computed from the
parameters alone, so freezing (:mod:`kiln.freezing`) pads it once.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

import kiln_autograd
from kiln.device_timing import decided_once
from kiln.graph_edits import call, computed_from, copy_graph, module_of, value

aten = torch.ops.aten
ALIGN = 8  # elements: 16 bytes of a 16-bit dtype
SMALLEST = 2**24  # M·N·K under which a product is not worth timing (nor padding)
log = logging.getLogger("kiln.padding")


def padded_products(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose badly aligned 16-bit products on CUDA are padded where that is
    faster on this device; None where none is."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    state = {placeholders[i] for i in kiln_autograd.unwritten_state(gm)}
    chosen = {n: p for n in gm.graph.nodes if (p := _padding(n, state)) is not None}
    if not chosen:
        return None
    graph, copies = copy_graph(gm)
    for node, (pad_n, pad_k) in chosen.items():
        _pad(graph, copies[node], pad_n, pad_k)
    graph.lint()
    return module_of(gm, graph)


def _padding(node: torch.fx.Node, state: set[torch.fx.Node]) -> tuple[int, int] | None:
    """(padding of N, padding of K) for a product worth padding, else None. ``state``: the
    inputs freezing reads once (a weight computed from them alone is padded once)."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    a, b = (node.args[0], node.args[1]) if node.target is aten.mm.default else node.args[1:3]
    a_val, b_val, out = value(a), value(b), value(node)
    if a_val is None or b_val is None or out is None or out.device.type != "cuda":
        return None
    if out.dtype not in (torch.bfloat16, torch.float16):
        return None
    sizes = (*a_val.shape, *b_val.shape)
    if not all(isinstance(s, int) for s in sizes):
        return None
    m, k, _, n = sizes
    pad_n, pad_k = -n % ALIGN, -k % ALIGN
    if not (pad_n or pad_k) or m * n * k < SMALLEST:
        return None
    weight = computed_from(b, state)
    shape = (m, n, k, a_val.stride(), b_val.stride(), out.dtype, out.device)
    if not _faster(*shape, pad_n, pad_k, weight):
        return None
    return pad_n, pad_k


def _pad(graph: torch.fx.Graph, node: torch.fx.Node, pad_n: int, pad_k: int) -> None:
    with graph.inserting_before(node):
        if node.target is aten.mm.default:
            bias, (a, b) = None, node.args
        else:
            bias, a, b = node.args[:3]
        if pad_k:
            a = call(graph, aten.constant_pad_nd.default, a, [0, pad_k])
            b = call(graph, aten.constant_pad_nd.default, b, [0, 0, 0, pad_k])
        if pad_n:
            b = call(graph, aten.constant_pad_nd.default, b, [0, pad_n])
            if bias is not None and value(bias).dim() and value(bias).shape[-1] > 1:
                bias = call(graph, aten.constant_pad_nd.default, bias, [0, pad_n])
        if bias is None:
            product = call(graph, aten.mm.default, a, b)
        else:
            product = call(graph, aten.addmm.default, bias, a, b, **node.kwargs)
        result = product
        if pad_n:
            n = value(node).shape[1]
            result = call(graph, aten.slice.Tensor, product, 1, 0, n)
            result = call(graph, aten.clone.default, result, memory_format=torch.contiguous_format)
    result.meta = {**node.meta, "val": result.meta["val"]}
    node.replace_all_uses_with(result)
    graph.erase_node(node)


@decided_once("padded products")
def _faster(m, n, k, a_stride, b_stride, dtype, device, pad_n, pad_k, weight) -> bool | None:
    """Whether the padded product (with its operands' padding, but a ``weight``'s, which
    freezing pads once, and the slice's copy) beats the plain one on ``device``, timed
    once per shape."""
    try:
        a = _strided_random((m, k), a_stride, dtype, device)
        b = _strided_random((k, n), b_stride, dtype, device)
        plain = _time(lambda: torch.mm(a, b))
        padded_b = torch.nn.functional.pad(b, (0, pad_n, 0, pad_k))

        def padded():
            pa = torch.nn.functional.pad(a, (0, pad_k)) if pad_k else a
            pb = padded_b if weight else torch.nn.functional.pad(b, (0, pad_n, 0, pad_k))
            out = torch.mm(pa, pb)
            return out[:, :n].contiguous() if pad_n else out

        padded_ms = _time(padded)
    except RuntimeError as exc:  # out of memory, say: keep the product as it is
        log.info("could not time padding %dx%dx%d: %s", m, n, k, exc)
        return None
    log.info("product %dx%dx%d %s: plain %.3f ms, padded %.3f ms", m, n, k, dtype, plain, padded_ms)
    return padded_ms < 0.9 * plain


def _strided_random(size, stride, dtype, device) -> torch.Tensor:
    """A random tensor of ``size`` laid out with ``stride`` (a transposed weight, say)."""
    order = sorted(range(len(size)), key=lambda d: stride[d], reverse=True)
    dense = torch.randn([size[d] for d in order], dtype=dtype, device=device)
    return dense.permute([order.index(d) for d in range(len(size))])


def _time(fn, repeats: int = 10) -> float:
    """Milliseconds per call of ``fn`` on the current CUDA stream (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats
