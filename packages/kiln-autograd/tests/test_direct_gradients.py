"""Gradients written into parameters' ``.grad`` by the compiled backward (direct_gradients)."""

import pytest
import torch

import kiln_autograd
from kiln_autograd.direct_gradients import DirectGradients, leaves_reached


def rand(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.fc2 = torch.nn.Linear(8, 6)
        self.bias = torch.nn.Parameter(torch.randn(6))

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x)))) + self.bias


def compile_direct(module: torch.nn.Module, *examples: torch.Tensor):
    gm = torch.fx.symbolic_trace(module)
    compiled = kiln_autograd.aot(gm, list(examples), lambda g, _: g, direct_gradients=True)
    return gm, compiled


def only_runner(compiled):
    (runner,) = compiled.runners.values()
    return runner


def accumulators_reached(out: torch.Tensor) -> set[int]:
    return {id(v) for v in leaves_reached(out)}


@pytest.mark.parametrize("x_requires_grad", [False, True])
def test_gradients_equal_eagers_and_skip_the_accumulators(check, x_requires_grad):
    compiled, _ = check(Block(), lambda: [rand(4, 6, grad=x_requires_grad)], direct_gradients=True)
    runner = only_runner(compiled)
    assert isinstance(runner.direct, DirectGradients)
    assert len(runner.direct.positions) == 7  # every parameter
    out = compiled(rand(4, 6, grad=x_requires_grad))
    reached = accumulators_reached(out)
    params = list(compiled.lifted.module.parameters())
    assert not reached & {id(p) for p in params}, "a parameter is still in autograd's graph"


def test_gradients_accumulate_over_backward_calls():
    torch.manual_seed(0)
    gm, compiled = compile_direct(Block(), rand(4, 6))
    reference = Block()
    reference.load_state_dict(gm.state_dict())
    for _ in range(3):
        x = rand(4, 6)
        weight = torch.randn(4, 6)
        (compiled(x) * weight).sum().backward()
        (reference(x) * weight).sum().backward()
    for (name, p), q in zip(gm.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_retained_graph_backward_twice_accumulates():
    gm, compiled = compile_direct(Block(), rand(4, 6))
    loss = compiled(rand(4, 6)).square().sum()
    loss.backward(retain_graph=True)
    once = {n: p.grad.clone() for n, p in gm.named_parameters()}
    loss.backward()
    for name, p in gm.named_parameters():
        torch.testing.assert_close(p.grad, 2 * once[name], msg=name)


def test_autograd_grad_of_an_input_leaves_parameters_alone():
    gm, compiled = compile_direct(Block(), rand(4, 6, grad=True))
    reference = Block()
    reference.load_state_dict(gm.state_dict())
    x = rand(4, 6, grad=True)
    (gx,) = torch.autograd.grad(compiled(x).square().sum(), x)
    (ex,) = torch.autograd.grad(reference(x).square().sum(), x)
    torch.testing.assert_close(gx, ex, rtol=1e-5, atol=1e-5)
    assert all(p.grad is None for p in gm.parameters())
    compiled(x).square().sum().backward(inputs=[x])
    assert all(p.grad is None for p in gm.parameters())
    torch.testing.assert_close(x.grad, ex, rtol=1e-5, atol=1e-5)


def test_hooks_run_as_autograd_runs_them():
    torch.manual_seed(0)
    gm, compiled = compile_direct(Block(), rand(4, 6))
    reference = Block()
    reference.load_state_dict(gm.state_dict())
    seen = []
    for model, tag in ((gm, "kiln"), (reference, "eager")):
        model.fc1.weight.register_hook(lambda g: g * 3)
        model.fc2.bias.register_post_accumulate_grad_hook(
            lambda p, tag=tag: seen.append((tag, p.grad.clone()))
        )
    x = rand(4, 6)
    compiled(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(gm.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)
    assert [tag for tag, _ in seen] == ["kiln", "eager"]
    torch.testing.assert_close(seen[0][1], seen[1][1], rtol=1e-5, atol=1e-5)


class BiasOnly(torch.nn.Module):
    """The bias's gradient is the incoming gradient itself; the weight's is laid out as
    the (transposed) parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(5, 3).t())  # strides (1, 3)
        self.bias = torch.nn.Parameter(torch.randn(3, 5))

    def forward(self, x):
        return x * self.weight + self.bias


def test_gradients_take_the_parameters_layout_and_own_their_memory():
    gm, compiled = compile_direct(BiasOnly(), rand(3, 5, grad=True))
    x = rand(3, 5, grad=True)
    out = compiled(x)
    upstream = torch.randn(3, 5)
    out.backward(upstream)
    assert gm.weight.grad.stride() == gm.weight.stride() == (1, 3)
    torch.testing.assert_close(gm.weight.grad, upstream * x.detach())
    torch.testing.assert_close(gm.bias.grad, upstream)
    before = x.grad.clone()
    gm.bias.grad.add_(1.0)  # the bias's gradient is its own memory, not x's or upstream's
    torch.testing.assert_close(x.grad, before)
    torch.testing.assert_close(upstream + 1.0, gm.bias.grad)


@pytest.mark.filterwarnings(r"ignore:Using backward\(\) with create_graph=True")
def test_double_backward_still_says_why():
    gm, compiled = compile_direct(Block(), rand(4, 6))
    compiled(rand(4, 6)).square().sum().backward(create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gm.fc1.weight.grad.sum().backward()


def test_without_the_option_parameters_stay_in_autograds_graph():
    gm = torch.fx.symbolic_trace(Block())
    compiled = kiln_autograd.aot(gm, [rand(4, 6)], lambda g, _: g)
    assert only_runner(compiled).direct is None
    reached = accumulators_reached(compiled(rand(4, 6)))
    assert {id(p) for p in gm.parameters()} <= reached


def test_with_torch_distributed_initialized_parameters_stay_in_autograds_graph(caplog):
    """DDP's reducer hooks the parameters' accumulators: with a process group, the
    parameters stay inputs (logged once), and the gradients are still eager's."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not built")
    gm, compiled = compile_direct(Block(), rand(4, 6))
    reference = Block()
    reference.load_state_dict(gm.state_dict())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with caplog.at_level("INFO", logger="kiln_autograd"):
            for _ in range(2):
                x = rand(4, 6)
                out = compiled(x)
                assert {id(p) for p in gm.parameters()} <= accumulators_reached(out)
                out.square().sum().backward()
                reference(x).square().sum().backward()
    finally:
        dist.destroy_process_group()
    for (name, p), q in zip(gm.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)
    notes = [r for r in caplog.records if "torch.distributed is initialized" in r.message]
    assert len(notes) == 1
