"""The decompose step against a retrace of the whole graph: decomposing the norms node by
node gives the loop IR that tracing every node again through the decompositions gives."""

import importlib

import pytest
import torch
import torch.fx.traceback as fx_traceback
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx, set_original_aten_op

from kiln_loopir import decompose, lower
from kiln_loopir.decompose import DECOMPOSED_OPS, decomposition_table
from kiln_loopir.testing import trace_aten


def retraced(gm):
    """The graph traced again as a whole through the decompositions: slow, for the tests."""
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = next(v.fake_mode for v in vals if isinstance(v, torch.Tensor))

    class KeepOrigins(torch.fx.Interpreter):
        def run_node(self, n):
            origin = n.meta.get("original_aten")
            if origin is None:
                return super().run_node(n)
            with set_original_aten_op(origin):
                return super().run_node(n)

    interpreter = KeepOrigins(gm)
    with fake_mode, fx_traceback.preserve_node_meta():
        return make_fx(
            lambda *args: interpreter.run(*args),
            decomposition_table=decomposition_table(),
            tracing_mode="real",
        )(*vals)


def r(*size):
    return torch.randn(*size)


CASES = {
    "layer_norm": (lambda x, w, b: F.layer_norm(x.exp(), (8,), w, b) * 2, [r(5, 8), r(8), r(8)]),
    "layer_norm_3d": (lambda x: F.layer_norm(x, (3, 4)), [r(2, 3, 4)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [r(2, 4, 3, 3), r(4), r(4)]),
    "batch_norm_eval": (
        lambda x, m, v: F.batch_norm(x, m, v, training=False),
        [r(3, 4, 5), r(4), r(4).abs() + 0.5],
    ),
    "batch_norm_train": (
        lambda x, w: F.batch_norm(x, None, None, w, training=True),
        [r(3, 4, 5), r(4)],
    ),
    "vector_norm": (lambda x: torch.linalg.vector_norm(x, 3, dim=1), [r(4, 6)]),
    "layer_norms_alike": (
        lambda x, w: (
            F.layer_norm(x, (6,), w),
            F.layer_norm(x * 2, (6,), w),
            F.layer_norm(x, (6,), w, eps=1e-3),
            F.layer_norm(x[:2], (6,), w),
        ),
        [r(4, 6), r(6)],
    ),
    "two_layer_norms": (
        lambda x, w: F.layer_norm(F.layer_norm(x, (6,), w) + x, (6,), w),
        [r(4, 6), r(6)],
    ),
}


# ops torch's core decompositions take apart already: traced without them
UNDECOMPOSED_CASES = {
    "std": (lambda x: (x.std(1), torch.std_mean(x, 0)), [r(5, 7)]),
    "activations": (lambda x: (F.mish(x), torch.logit(x.sigmoid()), F.glu(x, 1)), [r(4, 6)]),
    "norm_gradients": (lambda g, x, w: _norm_gradients(g, x, w), [r(3, 4, 5), r(3, 4, 5), r(4)]),
}


def _norm_gradients(g, x, w):
    """The gradients of a layer norm (over the last dimension) and of a batch norm in
    training (over channels), as the joint graphs of kiln-autograd keep them."""
    aten = torch.ops.aten
    _, mean, rstd = aten.native_layer_norm(x, [5], None, None, 1e-5)
    layer = aten.native_layer_norm_backward(g, x, [5], mean, rstd, None, None, [True, False, False])
    _, save_mean, save_invstd = aten.native_batch_norm(x, w, None, None, None, True, 0.1, 1e-5)
    batch = aten.native_batch_norm_backward(
        g, x, w, None, None, save_mean, save_invstd, True, 1e-5, [True, True, False]
    )
    return layer[0], batch[0], batch[1]


def traced(name, dynamic):
    if name in CASES:
        fn, inputs = CASES[name]
        return trace_aten(fn, inputs, dynamic=dynamic), inputs
    fn, inputs = UNDECOMPOSED_CASES[name]
    return make_fx(fn, tracing_mode="symbolic" if dynamic else "fake")(*inputs), inputs


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", [*CASES, *UNDECOMPOSED_CASES])
def test_decomposing_node_by_node_lowers_as_a_retrace_does(name, dynamic):
    gm, inputs = traced(name, dynamic)
    assert any(n.target in DECOMPOSED_OPS for n in gm.graph.nodes)
    decomposed = decompose(gm)
    assert not any(n.target in DECOMPOSED_OPS for n in decomposed.graph.nodes)
    expected = retraced(gm)
    assert [n.name for n in decomposed.graph.nodes if n.op == "placeholder"] == [
        n.name for n in expected.graph.nodes if n.op == "placeholder"
    ]
    assert lower(decomposed, inputs).format() == lower(expected, inputs).format()


def test_a_graph_without_decomposed_ops_is_returned_as_it_is():
    gm = trace_aten(lambda x: x.sin() + 1, [r(3)])
    assert decompose(gm) is gm


def test_nodes_alike_share_one_trace(monkeypatch):
    decompose_module = importlib.import_module("kiln_loopir.decompose")  # not the function
    traced_nodes = []
    trace = decompose_module._trace
    monkeypatch.setattr(
        decompose_module, "_trace", lambda node, *a: traced_nodes.append(node) or trace(node, *a)
    )
    gm, inputs = traced("layer_norms_alike", dynamic=False)
    decomposed = decompose(gm)
    # the second norm is like the first; another eps and another shape are traced anew
    assert len(traced_nodes) == 3
    assert lower(decomposed, inputs).format() == lower(retraced(gm), inputs).format()


def test_nodes_alike_share_one_trace_when_their_recorded_op_is_a_copy(monkeypatch):
    """A graph's tracer may record a copy of the op in ``meta["original_aten"]`` (it hashes
    like the op but compares unequal): each of a model's layer norms was traced again."""
    import copy

    decompose_module = importlib.import_module("kiln_loopir.decompose")
    traced_nodes = []
    trace = decompose_module._trace
    monkeypatch.setattr(
        decompose_module, "_trace", lambda node, *a: traced_nodes.append(node) or trace(node, *a)
    )
    gm, inputs = traced("layer_norms_alike", dynamic=False)
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            node.meta["original_aten"] = copy.copy(node.target)
    decomposed = decompose(gm)
    assert len(traced_nodes) == 3
    assert lower(decomposed, inputs).format() == lower(retraced(gm), inputs).format()
