"""Channels-last activations for graphs with 2-D convolutions, decided on the captured graph.

cuDNN runs its fast convolutions in NHWC. Given NCHW activations (what a model gets from
its input and keeps), it converts the input to NHWC and the output back to NCHW around
every convolution: two copies of each activation per convolution. So before kiln-autograd
traces a captured graph whose 2-D convolutions run on CUDA, :func:`channels_last` asks for
each convolution's input in channels-last layout (``x.contiguous(memory_format=
torch.channels_last)``, nothing where it already is). The convolution's output then comes
channels-last, the pointwise work and reductions after it keep that layout (their buffers
take the layout the traced values have), and so does the next convolution's input: only
the graph's first input is converted. The backward follows, as autograd derives it.

Each 4-D output of the graph is given back in the layout eager returns (``contiguous()``
where the captured graph gave a contiguous tensor). Graphs with no such convolution are
returned as they are.

By default (``options={"channels_last": None}``) only inference graphs on CUDA are laid
out so: a training step's batch norms reduce each channel over the batch and the image,
which in channels-last layout is a reduction across the innermost dimension that Kiln's
reduction kernels read more slowly (ResNet-50's step at batch 8, GPU-busy: 4.2 ms in NCHW,
5.1 ms in channels-last on an H200; inference on an H100: 1.70 ms NCHW, 1.30 ms
channels-last). ``True`` lays out every graph with convolutions, on the CPU too;
``False`` none.
"""

from __future__ import annotations

import torch
import torch.fx

CONV2D = frozenset({torch.conv2d, torch.convolution, torch.ops.aten.convolution.default})


def wanted(setting: bool | None, example_inputs: list[object]) -> tuple[bool, bool]:
    """(lay out this graph, on the CPU too) for ``options.channels_last``: by default only
    graphs that autograd does not differentiate (grad mode off, or no input needs grad)."""
    if setting is not None:
        return setting, setting
    training = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )
    return not training, False


def channels_last(gm: torch.fx.GraphModule, on_cpu: bool = False) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` whose 2-D convolutions read channels-last inputs, or None when it
    has none that qualify (on CUDA, or on any device with ``on_cpu``)."""
    convs = [n for n in gm.graph.nodes if _qualifies(n, on_cpu)]
    if not convs:
        return None
    graph, copies = _copy(gm.graph)
    new = torch.fx.GraphModule(gm, graph)
    for conv in convs:
        node = copies[conv]
        x = node.args[0]
        with new.graph.inserting_before(node):
            node.replace_input_with(x, _in_format(new.graph, x, torch.channels_last))
    _outputs_as_captured(new.graph)
    new.recompile()
    return new


def _qualifies(node: torch.fx.Node, on_cpu: bool) -> bool:
    """A convolution of a 4-D floating input that is not transposed."""
    if node.op != "call_function" or node.target not in CONV2D:
        return False
    x = node.args[0] if node.args else None
    val = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or not val.is_floating_point():
        return False
    if val.device.type != "cuda" and not (on_cpu and val.device.type == "cpu"):
        return False
    transposed = node.args[6] if node.target is not torch.conv2d and len(node.args) > 6 else False
    return not transposed


def _in_format(graph: torch.fx.Graph, x: torch.fx.Node, fmt: torch.memory_format):
    """``x.contiguous(memory_format=fmt)``, its example value kept for later passes."""
    node = graph.call_method("contiguous", (x,), {"memory_format": fmt})
    val = x.meta.get("example_value")
    if isinstance(val, torch.Tensor):
        node.meta["example_value"] = val.contiguous(memory_format=fmt)
    return node


def _outputs_as_captured(graph: torch.fx.Graph) -> None:
    """Each 4-D tensor output that was contiguous when captured is made contiguous again
    (a no-op where it still is); a channels-last one stays as it is."""
    output = graph.find_nodes(op="output")[0]
    for value in _output_nodes(output):
        val = value.meta.get("example_value")
        if not isinstance(val, torch.Tensor) or val.dim() != 4 or not val.is_contiguous():
            continue
        with graph.inserting_before(output):
            output.replace_input_with(value, _in_format(graph, value, torch.contiguous_format))


def _output_nodes(output: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(output.args, found.append)
    return list(dict.fromkeys(found))


def _copy(graph: torch.fx.Graph) -> tuple[torch.fx.Graph, dict[torch.fx.Node, torch.fx.Node]]:
    """A copy of ``graph`` whose nodes keep their metadata, and each node's copy."""
    new = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    new.output(new.graph_copy(graph, copies))
    for old, node in copies.items():
        node.meta = dict(old.meta)
    return new, copies
