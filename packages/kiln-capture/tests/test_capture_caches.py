"""What capture keeps per function or code object between captures (to capture a model's
repeated layers once each) follows the function when it changes."""

import torch
from recording import Recorder

from kiln_capture import capture
from kiln_capture.variables.functions import signature_of


def scaled(x, scale=2.0):
    return x * scale


def calls_scaled(x):
    return scaled(x)


def test_a_signature_is_read_again_when_the_defaults_change():
    first = signature_of(scaled)
    assert signature_of(scaled) is first
    original = scaled.__defaults__
    try:
        scaled.__defaults__ = (3.0,)
        assert signature_of(scaled).parameters["scale"].default == 3.0
        x = torch.ones(2)
        torch.testing.assert_close(capture(calls_scaled, Recorder())(x), x * 3)
    finally:
        scaled.__defaults__ = original
    assert signature_of(scaled).parameters["scale"].default == 2.0


def test_a_signature_is_read_again_when_the_code_changes():
    def other(x, scale=5.0, *, shift=1.0):
        return x * scale + shift

    original = scaled.__code__
    try:
        signature_of(scaled)
        scaled.__code__ = other.__code__
        scaled.__kwdefaults__ = {"shift": 1.0}
        assert list(signature_of(scaled).parameters) == ["x", "scale", "shift"]
        x = torch.ones(2)
        torch.testing.assert_close(capture(calls_scaled, Recorder())(x), x * 2 + 1)
    finally:
        scaled.__code__ = original
        scaled.__kwdefaults__ = None
    assert list(signature_of(scaled).parameters) == ["x", "scale"]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        y = self.drop(self.linear(x).transpose(0, 1).contiguous().transpose(0, 1))
        z = self.norm(y + x)
        z.add_(1)  # written to: never answered from the memo
        return torch.nn.functional.gelu(z)


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        w = x.detach().clone()
        w.requires_grad_()  # changes its argument: runs each time
        v = x.detach().clone()
        v.requires_grad_()
        return x, w.requires_grad, v.requires_grad


def example_values(model, x):
    backend = Recorder()
    out = capture(model, backend)(x)
    graph = backend.graphs[0].graph
    values = [n.meta.get("example_value") for n in graph.nodes if n.op == "call_function"]
    return out, [
        (str(n.target), tuple(v.shape), v.stride(), v.dtype, v.requires_grad, v._is_view())
        for n, v in zip(graph.nodes, values, strict=False)
        if isinstance(v, torch.Tensor)
    ]


def test_repeated_layers_get_the_fake_results_of_running_each_call(monkeypatch):
    from kiln_capture.fake_memo import FakeMemo

    model = Stack().eval()
    x = torch.randn(4, 3, 8)
    answered = []
    recall = FakeMemo.recall

    def counted_recall(self, key, tensors):
        answered.append(recall(self, key, tensors))
        return answered[-1]

    for grad in (False, True):
        answered.clear()
        with torch.set_grad_enabled(grad):
            with monkeypatch.context() as counted:
                counted.setattr(FakeMemo, "recall", counted_recall)
                out, remembered = example_values(model, x)
            with monkeypatch.context() as patched:
                patched.setattr(FakeMemo, "key", lambda self, *args: None)
                _, every_call_run = example_values(model, x)
        # blocks 2 and 3, mostly (with grad too: a result that requires grad, written to
        # in place after, gets autograd history of its own)
        assert sum(r is not None for r in answered) >= 6
        assert remembered == every_call_run
        torch.testing.assert_close(out[0], model(x)[0])
        assert out[1:] == (True, True)


def test_a_remembered_result_is_a_new_tensor_each_time():
    def fn(x):
        a = x + 1
        b = x + 1  # answered from the memo
        b.mul_(2)  # must not change a
        return a, b

    x = torch.randn(3)
    a, b = capture(fn, Recorder())(x)
    torch.testing.assert_close(a, x + 1)
    torch.testing.assert_close(b, (x + 1) * 2)


def test_a_dispatcher_that_cannot_be_built_runs_the_function_eagerly(monkeypatch):
    import pytest

    import kiln_capture.api

    make_call = kiln_capture.api.make_call

    def broken(fn, captured, bound, entries=()):
        if entries:  # the guard function is compiled here first: a line that does not compile
            raise SyntaxError("a guard line")
        return make_call(fn, captured, bound, entries)

    monkeypatch.setattr(kiln_capture.api, "make_call", broken)
    captured = capture(calls_scaled, Recorder())
    x = torch.ones(2)
    with pytest.warns(RuntimeWarning, match="internal error: SyntaxError"):
        torch.testing.assert_close(captured(x), x * 2)
    torch.testing.assert_close(captured(x), x * 2)
