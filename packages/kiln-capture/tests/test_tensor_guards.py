"""The parameters and buffers of a guard, checked in one ``___tensors_match`` call: every
change to the model that would make a captured graph wrong still misses, with either
tensor matcher this package has (the Python reference; kiln's tests cover its native one)."""

import pytest
import torch
from recording import Recorder

from kiln_capture import capture


@pytest.fixture(params=["python"], autouse=True)
def matcher(request, monkeypatch):
    monkeypatch.setenv("KILN_GUARD_TENSORS", request.param)
    return request.param


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, x):
        return torch.relu(self.lin(x)) + self.offset


def compiled_net():
    torch.manual_seed(0)
    net, backend = Net(), Recorder()
    captured = capture(net, backend)
    x = torch.randn(2, 4)
    torch.testing.assert_close(captured(x), net(x))
    return net, captured, backend, x


def check_matches_eager(net, captured, x):
    x = x.to(net.lin.weight.dtype)
    torch.testing.assert_close(captured(x), net(x))


def test_state_tensors_are_checked_in_one_call(matcher):
    net, captured, _, _ = compiled_net()
    guard = captured._captured.entries[0].guard
    assert guard.tensors.name == matcher
    assert guard.tensor_exprs == [
        "self._modules['lin']._parameters['weight']",
        "self._modules['lin']._parameters['bias']",
        "self._buffers['offset']",
    ]
    assert "___tensors_match(" in guard.source
    assert "___e0_tensors_match(" in captured._captured.dispatch_source()
    compile(guard.source, "<guard>", "exec")


def test_a_cached_call_passes_the_guard():
    net, captured, backend, x = compiled_net()
    for _ in range(3):
        torch.testing.assert_close(captured(x), net(x))
    assert len(backend.graphs) == 1


def test_module_half_misses():
    net, captured, backend, x = compiled_net()
    net.half()  # same Parameter objects, new dtype
    check_matches_eager(net, captured, x)
    assert len(backend.graphs) == 2
    first = captured._captured.entries[-1].guard
    assert first.why(net, x).startswith("self._modules['lin']._parameters['weight']: ")


def test_a_replaced_parameter_is_used():
    net, captured, backend, x = compiled_net()
    net.lin.weight = torch.nn.Parameter(torch.randn(4, 4))  # same metadata, new values
    torch.testing.assert_close(captured(x), net(x))
    assert len(backend.graphs) == 1
    net.lin.weight = torch.nn.Parameter(torch.randn(4, 4).t())  # new strides
    torch.testing.assert_close(captured(x), net(x))
    assert len(backend.graphs) == 2


def test_requires_grad_flipped_with_grad_enabled_misses():
    net, captured, backend, x = compiled_net()
    net.lin.weight.requires_grad_(False)
    out = captured(x)
    torch.testing.assert_close(out, net(x))
    assert len(backend.graphs) == 2
    out.sum().backward()
    assert net.lin.weight.grad is None and net.lin.bias.grad is not None


@pytest.mark.parametrize(
    "change",
    [
        lambda p: torch.randn(3, 4),  # shape
        lambda p: p.data.t(),  # strides, same storage and data pointer
        lambda p: p.data.view(torch.int32),  # dtype, same storage and data pointer
    ],
    ids=["shape", "strides-same-storage", "dtype-same-storage"],
)
def test_data_assignment_misses(change):
    torch.manual_seed(0)
    module, backend = torch.nn.Linear(4, 4, bias=False), Recorder()
    module.weight.requires_grad_(False)  # a view as int32 cannot require grad
    captured = capture(lambda x: x * module.weight.sum(0), backend)
    x = torch.randn(2, 4)
    captured(x)
    with torch.no_grad():
        module.weight.data = change(module.weight)
    torch.testing.assert_close(captured(x), x * module.weight.sum(0))
    assert len(backend.graphs) == 2


def test_buffer_changed_in_place_misses():
    net, captured, backend, x = compiled_net()
    net.offset.unsqueeze_(0)  # same object, same data pointer, new size and strides
    torch.testing.assert_close(captured(x), net(x))
    assert len(backend.graphs) == 2


def test_hooks_added_to_a_submodule_run():
    net, captured, backend, x = compiled_net()
    net.lin.register_forward_hook(lambda m, args, out: out * 0)
    torch.testing.assert_close(captured(x), net(x))
    torch.testing.assert_close(captured(x), net.offset.expand(2, 4))


def test_one_tensor_under_two_names():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    backend = Recorder()
    captured = capture(lambda x: a(x) + b(x), backend)
    x = torch.randn(2, 4)
    torch.testing.assert_close(captured(x), a(x) + b(x))
    b.weight = a.weight  # tied after capture: the values must follow
    with torch.no_grad():
        a.weight.mul_(2)
    torch.testing.assert_close(captured(x), a(x) + b(x))


def test_inference_mode_tensor_misses():
    net, captured, backend, x = compiled_net()
    with torch.inference_mode():
        net.offset = torch.zeros(4)  # an inference tensor: other dispatch keys
    with torch.no_grad():
        torch.testing.assert_close(captured(x), net(x))
    assert len(backend.graphs) == 2
