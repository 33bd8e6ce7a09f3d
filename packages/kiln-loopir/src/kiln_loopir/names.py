"""Kernel names: what a kernel computes, readable in profiles, perf and debug dumps.

A kernel is named ``kiln_<what>_<index>``: ``<what>`` lists the ops its IR nodes were
lowered from (:attr:`~kiln_loopir.ir.ComputedNode.origins`), in node order, each once,
``fused_`` in front when there are several; ``<index>`` is the kernel's place among the
graph's kernels in program order, so names are unique within a graph and the same graph
always gets the same names::

    kiln_fused_layer_norm_gelu_0     # a decomposed layer norm and the gelu after it
    kiln_softmax_1                   # the reductions and division of one softmax
    kiln_fused_add_relu_2

Ops are named as a person reading a profile knows them: the norms by what they were
before decomposition (``native_layer_norm`` -> ``layer_norm``), without namespace,
overload or leading underscores (``aten._to_copy.default`` -> ``to_copy``). More than
:data:`MAX_OPS` ops (or a long list) keep the first ones and end in ``etc``. A name is a
valid C and Python identifier.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kiln_loopir.ir import ComputedNode, Reduction, Scan, Scatter

PREFIX = "kiln"
MAX_OPS = 4  # op words in a name, ``etc`` included
MAX_CHARS = 48  # of the op words together, underscores included

# op names that read better under another name (after namespace and overload are dropped)
ALIASES = {
    "_native_batch_norm_legit": "batch_norm",
    "_native_batch_norm_legit_no_training": "batch_norm",
    "_native_batch_norm_legit_functional": "batch_norm",
    "native_batch_norm_backward": "batch_norm_backward",
    "linalg_vector_norm": "vector_norm",
    "_softmax_backward_data": "softmax_backward",
    "_log_softmax_backward_data": "log_softmax_backward",
    "convert_element_type": "convert",
}


def op_word(origin: str) -> str:
    """The short name of an op: ``"aten.native_layer_norm.default"`` -> ``"layer_norm"``
    (``""`` when nothing printable is left)."""
    parts = origin.split(".")
    name = parts[-2] if len(parts) >= 3 else parts[-1]  # namespace.op.overload, or op
    name = ALIASES.get(name, name).lstrip("_").removeprefix("native_")
    return re.sub(r"_+", "_", re.sub(r"[^0-9A-Za-z_]", "_", name)).strip("_")


def op_words(nodes: Sequence[ComputedNode]) -> list[str]:
    """The ops ``nodes`` were lowered from, each once, in node order; a node that knows no
    origin counts as its kind (``pointwise``, ``reduction``, ``scatter``)."""
    words: dict[str, None] = {}
    for node in nodes:
        found = [w for w in map(op_word, node.origins) if w]
        if not found:
            body = node.body
            kind = {Reduction: "reduction", Scan: "scan"}.get(type(body), "pointwise")
            found = ["scatter" if isinstance(body, Scatter) else kind]
        words.update(dict.fromkeys(found))
    return list(words)


def describe(nodes: Sequence[ComputedNode]) -> str:
    """``kiln_<what>``: the kernel's name without its index (what Triton names a kernel
    function, so identical kernels share one compiled module)."""
    words = op_words(nodes)
    fused = ["fused"] if len(words) > 1 else []
    if len(words) > MAX_OPS or len("_".join(words)) > MAX_CHARS:
        room = MAX_CHARS - len("_etc")
        kept = words[: MAX_OPS - 1]
        while len(kept) > 1 and len("_".join(kept)) > room:
            kept.pop()
        words = [kept[0][:room].rstrip("_"), *kept[1:], "etc"]
    return "_".join([PREFIX, *fused, *words])


def kernel_name(nodes: Sequence[ComputedNode], index: int) -> str:
    """The name of the kernel of ``nodes`` that is the graph's ``index``-th."""
    return f"{describe(nodes)}_{index}"
