"""The decompose step: rewrite the ops loopir lowers through decompositions (the norms).

The graph is retraced under its own fake mode with ``make_fx`` and a small table from
``torch._decomp``; ops not in the table are kept as they are. Every node of the result
records the op it came from in ``meta["original_aten"]`` (``aten.native_layer_norm`` on the
nodes of a layer norm; the op a node already recorded, where the graph's tracer kept one),
which kernel names are made of.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch._decomp import get_decompositions
from torch.fx.experimental.proxy_tensor import make_fx, set_original_aten_op

aten = torch.ops.aten

DECOMPOSED_OPS = [
    aten.native_layer_norm.default,
    aten.native_group_norm.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit_functional.default,
    aten.std.correction,
    aten.std_mean.correction,
    aten.linalg_vector_norm.default,
    aten.mish.default,
    aten.logit.default,
    aten.glu.default,
]


def decomposition_table() -> dict:
    return get_decompositions(DECOMPOSED_OPS)


def needs_decomposition(gm: torch.fx.GraphModule) -> bool:
    table = decomposition_table()
    return any(n.op == "call_function" and n.target in table for n in gm.graph.nodes)


def decompose(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with the ops of :data:`DECOMPOSED_OPS` decomposed (``gm`` itself if none)."""
    if not needs_decomposition(gm):
        return gm
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = next(
        (v.fake_mode for v in vals if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode")),
        None,
    )
    if fake_mode is None:
        raise ValueError(
            "the graph's placeholders carry no fake tensors in meta['val']: trace it with "
            "make_fx(..., tracing_mode='fake' or 'symbolic') first"
        )
    interpreter = _KeepOrigins(gm)
    with fake_mode, fx_traceback.preserve_node_meta():
        return make_fx(
            lambda *args: interpreter.run(*args),
            decomposition_table=decomposition_table(),
            tracing_mode="real",
        )(*vals)


class _KeepOrigins(torch.fx.Interpreter):
    """Runs each node with the op it records as its origin (``meta["original_aten"]``), so
    the nodes it becomes keep that origin rather than the node's own op."""

    def run_node(self, n: torch.fx.Node) -> object:
        origin = n.meta.get("original_aten")
        if origin is None:
            return super().run_node(n)
        with set_original_aten_op(origin):
            return super().run_node(n)
