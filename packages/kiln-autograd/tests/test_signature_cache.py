"""Signature records: a second compile rebuilds the graphs from the record, without tracing."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import kiln_autograd
import kiln_autograd.api
import kiln_autograd.trace
from kiln_autograd.records import Unserializable, _target_name


class DictCache:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def load(self, key: str) -> bytes | None:
        return self.data.get(key)

    def store(self, key: str, data: bytes) -> None:
        self.data[key] = data


class MLP(torch.nn.Module):
    """Parameters read through get_attr (no call_module), a view output, a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.b = torch.nn.Parameter(torch.randn(8))
        self.g = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        h = F.layer_norm(F.linear(x, self.w, self.b), (8,), self.g)
        h = F.gelu(h) * torch.tensor([2.0])
        return h[:, 1:5].sum(0), h.transpose(0, 1)


class Recorder:
    """A compiler that notes each graph's code and whether it was restored, runs it as is."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        assert len(example_inputs) == len(list(gm.graph.find_nodes(op="placeholder")))
        assert all(isinstance(e, torch.Tensor) for e in example_inputs)
        self.seen.append((kiln_autograd.is_restored(gm), gm.code))
        return gm.forward


@pytest.fixture
def traces(monkeypatch):
    """How many times make_fx traced a graph (the analysis too)."""
    count = {"make_fx": 0, "analyze": 0}
    real_make_fx, real_analyze = kiln_autograd.trace.make_fx, kiln_autograd.api.analyze

    def make_fx(*args, **kwargs):
        count["make_fx"] += 1
        return real_make_fx(*args, **kwargs)

    def analyze(*args, **kwargs):
        count["analyze"] += 1
        return real_analyze(*args, **kwargs)

    monkeypatch.setattr(kiln_autograd.trace, "make_fx", make_fx)
    monkeypatch.setattr(kiln_autograd.api, "analyze", analyze)
    return count


def graph_module() -> tuple[torch.nn.Module, torch.fx.GraphModule]:
    model = MLP()
    return model, torch.fx.symbolic_trace(model)


# decomposed layer_norm and gelu round differently from eager's kernels
CLOSE = {"rtol": 1e-4, "atol": 1e-4}


def check_training(gm, model, cache, compiler, **kwargs):
    x = torch.randn(4, 8, requires_grad=True)
    compiled = kiln_autograd.aot(gm, [x], compiler, cache=cache, **kwargs)
    x2 = torch.randn(4, 8, requires_grad=True)  # fresh values, same signature
    eager_model = copy.deepcopy(model)
    x_eager = x2.detach().clone().requires_grad_(True)
    out = compiled(x2)
    expected = eager_model(x_eager)
    torch.testing.assert_close(out, expected, **CLOSE)
    sum(o.square().sum() for o in out).backward()
    sum(o.square().sum() for o in expected).backward()
    torch.testing.assert_close(x2.grad, x_eager.grad, **CLOSE)
    for name, p in eager_model.named_parameters():
        torch.testing.assert_close(getattr(gm, name).grad, p.grad, **CLOSE)
        getattr(gm, name).grad = None


def test_a_training_record_is_restored_without_tracing(traces):
    model, gm = graph_module()
    cache, compiler = DictCache(), Recorder()
    check_training(gm, model, cache, compiler)
    assert len(cache.data) == 1
    assert traces["make_fx"] == 1 and traces["analyze"] == 1
    traced = compiler.seen[:]
    assert [r for r, _ in traced] == [False, False]  # forward now, backward at backward

    check_training(gm, model, cache, compiler)
    assert traces["make_fx"] == 1 and traces["analyze"] == 1, "the second compile traced"
    restored = compiler.seen[2:]
    assert [r for r, _ in restored] == [True, True]  # both graphs compiled at once
    assert [c for _, c in restored] == [c for _, c in traced], "the same gm.code"


def test_an_inference_record_is_restored_without_tracing(traces):
    model, gm = graph_module()
    cache, compiler = DictCache(), Recorder()
    x = torch.randn(4, 8)
    with torch.no_grad():
        first = kiln_autograd.aot(gm, [x], compiler, cache=cache)
        second = kiln_autograd.aot(gm, [x], compiler, cache=cache)
        y = torch.randn(4, 8)
        torch.testing.assert_close(second(y), model(y), **CLOSE)
        torch.testing.assert_close(first(y), model(y), **CLOSE)
    assert traces["make_fx"] == 1
    (traced, code), (restored, code2) = compiler.seen
    assert (traced, restored) == (False, True) and code == code2


def test_the_key_follows_the_signature():
    _, gm = graph_module()
    cache = DictCache()

    def step(x, **options):  # a training record is stored once its backward compiled
        compiled = kiln_autograd.aot(gm, [x], Recorder(), cache=cache, **options)
        before = len(cache.data)
        _sum(compiled(x)).backward()
        assert len(cache.data) == before + 1, "stored before its backward compiled"

    step(torch.randn(4, 8))
    step(torch.randn(5, 8))
    step(torch.randn(4, 8, requires_grad=True))
    step(torch.randn(4, 8), partitioner="default")
    with torch.no_grad():
        kiln_autograd.aot(gm, [torch.randn(4, 8)], Recorder(), cache=cache)
    assert len(cache.data) == 5


def _sum(out) -> torch.Tensor:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor))


def test_a_compiler_that_needs_the_trace_gets_it(traces):
    model, gm = graph_module()
    cache = DictCache()
    check_training(gm, model, cache, Recorder())

    class Refusing(Recorder):
        def __call__(self, gm, example_inputs):
            if kiln_autograd.is_restored(gm) and len(self.seen) == 1:  # the backward
                raise kiln_autograd.NeedsTrace("no cached backward")
            return super().__call__(gm, example_inputs)

    compiler = Refusing()
    check_training(gm, model, cache, compiler)
    assert traces["make_fx"] == 2, "traced again"
    assert [r for r, _ in compiler.seen] == [True, False, False]


def test_a_corrupt_record_is_ignored_with_a_log_line(traces, caplog):
    model, gm = graph_module()
    cache = DictCache()
    check_training(gm, model, cache, Recorder())
    (key,) = cache.data
    cache.data[key] = cache.data[key][:100]
    with caplog.at_level(logging.WARNING, logger="kiln_autograd"):
        check_training(gm, model, cache, Recorder())
    assert any("ignoring signature record" in r.getMessage() for r in caplog.records)
    assert traces["make_fx"] == 2
    check_training(gm, model, cache, Recorder())  # the record was stored again
    assert traces["make_fx"] == 2


def test_dynamic_shapes_and_custom_decompositions_are_not_cached():
    model, gm = graph_module()
    cache = DictCache()
    check_training(gm, model, cache, Recorder(), dynamic=True)
    check_training(gm, model, cache, Recorder(), decompositions={})
    assert cache.data == {}


def test_modules_called_through_call_module_are_not_cached():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    cache = DictCache()
    kiln_autograd.aot(gm, [torch.randn(2, 4)], Recorder(), cache=cache)
    assert cache.data == {}  # a submodule's settings are not in the graph's code


def test_targets_outside_the_op_registry_are_refused():
    assert _target_name(torch.ops.aten.addmm.default) == "torch.ops.aten.addmm.default"
    assert _target_name(__import__("operator").getitem) == "operator.getitem"
    with pytest.raises(Unserializable):
        _target_name(lambda x: x)


def traced_forward(signatures: DictCache) -> torch.fx.GraphModule:
    """The forward graph a compiler gets from a traced training signature (its record
    stored in ``signatures``)."""
    seen: list[torch.fx.GraphModule] = []

    def keep(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    model, gm = graph_module()
    check_training(gm, model, signatures, keep)
    return seen[0]


def test_a_compiler_s_graphs_round_trip_as_a_record_of_their_own():
    signatures = DictCache()
    forward = traced_forward(signatures)
    info = {"made": "by a test", "counts": [1, 2]}
    graphs, back = kiln_autograd.decode_graphs(kiln_autograd.encode_graphs({"fw": forward}, info))
    assert back == info
    restored = graphs["fw"]
    assert restored.code == forward.code and kiln_autograd.is_restored(restored)
    placeholders = restored.graph.find_nodes(op="placeholder")
    args = [torch.randn(p.meta["val"].shape) for p in placeholders]
    with torch.no_grad():
        torch.testing.assert_close(restored(*args), forward(*args))
    (signature,) = signatures.data.values()
    with pytest.raises(ValueError, match="not of graphs"):
        kiln_autograd.decode_graphs(signature)


def test_a_restored_graph_gives_its_code_without_generating_it_until_it_changes():
    forward = traced_forward(DictCache())
    graphs, _ = kiln_autograd.decode_graphs(kiln_autograd.encode_graphs({"fw": forward}, {}))
    restored = graphs["fw"]
    assert kiln_autograd.graph_code(restored) == forward.code
    assert restored._needs_recompile(), "graph_code generated the restored graph's code"
    output = restored.graph.find_nodes(op="output")[0]
    with restored.graph.inserting_before(output):
        restored.graph.call_function(torch.ops.aten.relu.default, (output.args[0][0],))
    assert kiln_autograd.graph_code(restored) != forward.code  # changed: generated again
