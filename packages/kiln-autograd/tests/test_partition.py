"""The partitioners: what the min-cut saves, what it never recomputes, and torch as reference."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import kiln_autograd
from kiln_autograd.mincut import value_bytes
from kiln_autograd.recompute import COMPUTE_BOUND_OPS, is_random, op_name


def rand(*shape):
    return torch.randn(*shape, requires_grad=True)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.drop = torch.nn.Dropout(0.2)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return (self.fc2(self.drop(F.gelu(self.fc1(x)))).tanh(),)


def pointwise_chain(x, y):
    return ((x.sin() * y).exp().tanh() + y.cos(),)


def softmax_matmul(q, k, v):
    return ((q @ k.transpose(-1, -2)).softmax(-1) @ v,)


CASES = {
    "mlp": (lambda: torch.fx.symbolic_trace(MLP().train()), lambda: [rand(8, 16)]),
    "pointwise": (lambda: torch.fx.symbolic_trace(pointwise_chain), lambda: [rand(32, 32)] * 2),
    "attention": (
        lambda: torch.fx.symbolic_trace(softmax_matmul),
        lambda: [rand(2, 8, 4), rand(2, 8, 4), rand(2, 8, 4)],
    ),
}


def saved_bytes_of(parts: kiln_autograd.PartitionedGraphs) -> float:
    placeholders = [n for n in parts.bw.graph.nodes if n.op == "placeholder"]
    return sum(value_bytes(n) for n in placeholders[: parts.num_saved_tensors])


def joint_of(name):
    build, inputs = CASES[name]
    return kiln_autograd.trace_joint_graph(build(), inputs())


def tangent_free_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    tainted = {n for n in gm.graph.nodes if n.op == "placeholder" and "tangents" in n.name}
    for node in gm.graph.nodes:
        if any(i in tainted for i in node.all_input_nodes):
            tainted.add(node)
    return [n for n in gm.graph.nodes if n not in tainted and n.op == "call_function"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_never_recomputes_matmuls_or_random_ops(name):
    parts = kiln_autograd.partition(joint_of(name))
    for node in tangent_free_nodes(parts.bw):
        assert not is_random(node), f"backward recomputes {node.format_node()}"
        if isinstance(node.target, torch._ops.OpOverload):
            assert op_name(node.target) not in COMPUTE_BOUND_OPS, node.format_node()


@pytest.mark.parametrize("name", sorted(CASES))
def test_min_cut_saves_no_more_than_saving_everything(name):
    joint = joint_of(name)
    min_cut = kiln_autograd.partition(joint, "min_cut")
    default = kiln_autograd.partition(joint, "default")
    assert saved_bytes_of(min_cut) <= saved_bytes_of(default)


def test_pointwise_chain_saves_only_its_inputs():
    parts = kiln_autograd.partition(joint_of("pointwise"))
    saved = parts.saved_names()
    assert all(name.startswith("primals") for name in saved), saved
    assert saved_bytes_of(parts) == parts.saved_bytes() == 2 * 32 * 32 * 4


@pytest.mark.parametrize("partitioner", ["min_cut", "default"])
def test_saved_weight_views_are_saved_as_the_weights(partitioner):
    """A linear layer's backward reads its transposed weight: the forward saves the weight
    itself (a runtime reads a parameter in place) and the backward transposes it again."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = rand(4, 16)
    joint = kiln_autograd.trace_joint_graph(model, [x])
    parts = kiln_autograd.partition(joint, partitioner)
    primals = [n.name for n in joint.gm.graph.find_nodes(op="placeholder")][: joint.num_inputs]
    weights = {primals[0], primals[2]}  # state comes first: fc1.weight, fc1.bias, fc2.weight
    saved = parts.saved_names()
    assert weights <= set(saved), saved
    assert not any(n.startswith(("permute", "t_", "transpose")) for n in saved), saved
    expected = model(x)
    got = kiln_autograd.aot(model, [x], lambda g, _: g, partitioner=partitioner)(x)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got.square().sum(), [x, *model.parameters()])
    want = torch.autograd.grad(expected.square().sum(), [x, *model.parameters()])
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w)


def test_compiles_are_logged_with_their_graphs():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("kiln_autograd")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        build, inputs = CASES["mlp"]
        kiln_autograd.aot(build(), inputs(), lambda g, _: g)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    text = "\n".join(r.getMessage() for r in records)
    assert "min_cut partition saves" in text and "# backward" in text


def test_partitioned_graphs_print_and_verify():
    parts = kiln_autograd.partition(joint_of("mlp"))
    text = str(parts)
    assert "# forward" in text and "# backward" in text and "tangents_1" in text
    kiln_autograd.verify_op_set(parts.fw, "forward graph")
    kiln_autograd.verify_op_set(parts.bw, "backward graph")


def measured_saved_bytes(fn, inputs) -> int:
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(storages.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_saves_no_more_bytes_than_torch_min_cut(name):
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.compilers import make_boxed_compiler
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    build, make_inputs = CASES[name]
    gm, inputs = build(), make_inputs()
    ours = kiln_autograd.aot(copy.deepcopy(gm), inputs, lambda g, _: g)
    nop = make_boxed_compiler(lambda g, _: g)
    theirs = aot_module_simplified(
        copy.deepcopy(gm),
        inputs,
        fw_compiler=nop,
        bw_compiler=nop,
        partition_fn=min_cut_rematerialization_partition,
        decompositions=core_aten_decompositions(),
    )
    ours_bytes = measured_saved_bytes(ours, inputs)
    theirs_bytes = measured_saved_bytes(lambda *a: theirs(*a), inputs)
    assert 0 < ours_bytes <= theirs_bytes


def test_forward_graph_notes_its_saved_outputs():
    seen = {}

    def keep(gm, _):
        seen.setdefault("fw", gm)
        return gm

    build, inputs = CASES["mlp"]
    kiln_autograd.aot(build(), inputs(), keep)(*inputs())
    fw = seen["fw"]
    (output,) = fw.graph.find_nodes(op="output")
    n_outputs = len(output.args[0])
    saved = kiln_autograd.saved_outputs(fw)
    assert saved and saved == tuple(range(n_outputs - len(saved), n_outputs))


def test_the_norms_gradients_stay_whole_in_the_joint_graph():
    """kiln-loopir decomposes them, once per layout (a model's repeated layers share it)."""

    class Norms(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)
            self.ln = torch.nn.LayerNorm(5)

        def forward(self, x):
            return (self.ln(self.bn(x)).relu(),)

    joint = kiln_autograd.trace_joint_graph(
        torch.fx.symbolic_trace(Norms().train()), [rand(3, 4, 5)]
    )
    targets = {n.target for n in joint.gm.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    assert aten.native_layer_norm_backward.default in targets
    assert aten.native_batch_norm_backward.default in targets


def test_the_min_cut_module_is_imported_in_a_thread(monkeypatch):
    """Its import (networkx's, mostly reading files) overlaps the tracing that precedes it."""
    import importlib
    import sys

    partition = importlib.import_module("kiln_autograd.partition")
    monkeypatch.delitem(sys.modules, "kiln_autograd.mincut")
    monkeypatch.setattr(partition, "_min_cut_import", None)
    partition.import_min_cut_in_background()
    thread = partition._min_cut_import
    assert thread is not None and thread.name == "kiln-autograd-import"
    thread.join(timeout=60)
    assert "kiln_autograd.mincut" in sys.modules


@pytest.mark.parametrize("grad", [True, False])
def test_a_training_compile_starts_the_min_cut_import_before_tracing(monkeypatch, grad):
    from kiln_autograd import api

    started = []
    traced = []
    monkeypatch.setattr(api, "import_min_cut_in_background", lambda: started.append(len(traced)))
    real_analyze = api.analyze
    monkeypatch.setattr(api, "analyze", lambda *a, **k: traced.append(1) or real_analyze(*a, **k))
    x, y = torch.randn(4, 8, requires_grad=grad), torch.randn(4, 8)
    compiled = kiln_autograd.aot(torch.fx.symbolic_trace(pointwise_chain), [x, y], lambda gm, _: gm)
    torch.testing.assert_close(compiled(x, y)[0], pointwise_chain(x, y)[0])
    assert started == ([0] if grad else [])
