"""Modules in train mode: parameters, buffers, dropout, grads that eager leaves as None."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import kiln_autograd


def rand(*shape, grad=True):
    return torch.randn(*shape).requires_grad_(grad)


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return (F.relu(self.bn(self.conv(x))).mean(dim=(2, 3)),)


class MLPDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.drop = torch.nn.Dropout(0.3)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return (self.fc2(self.drop(F.gelu(self.fc1(x)))),)


class UnusedAndDetached(torch.nn.Module):
    """``frozen`` is read only through detach and ``dead`` not at all: eager leaves None."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Parameter(torch.randn(5))
        self.frozen = torch.nn.Parameter(torch.randn(5))
        self.dead = torch.nn.Parameter(torch.randn(5))
        self.register_buffer("scale", torch.rand(5) + 0.5)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls.add_(1)
        return (x * self.used * self.frozen.detach() * self.scale, self.calls.clone())


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(4, 3)

    def forward(self, x):
        return (self.a(x), self.b(x))


class FrozenEncoder(torch.nn.Module):
    """A frozen layer (requires_grad=False) under a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(6, 6).requires_grad_(False)
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x):
        return (self.head(torch.tanh(self.encoder(x))),)


class Methods(torch.nn.Module):
    """call_method, call_module and get_attr nodes (a constant tensor too)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.w = torch.nn.Parameter(torch.randn(6))
        self.const = torch.randn(6)

    def forward(self, x):
        y = self.lin(x).softmax(-1).transpose(0, 1).contiguous()
        return (y.sum(1) * self.w + self.const,)


@pytest.mark.parametrize(
    "module, shape",
    [
        (ConvBN, (2, 3, 5, 5)),
        (MLPDropout, (6, 8)),
        (UnusedAndDetached, (3, 5)),
        (FrozenEncoder, (4, 6)),
        (Methods, (4, 6)),
    ],
)
def test_module_matches_eager_in_train_mode(module, shape, check):
    torch.manual_seed(0)
    check(module().train(), lambda: [rand(*shape)], calls=3)


def test_module_matches_eager_in_eval_mode(check):
    torch.manual_seed(0)
    check(ConvBN().eval(), lambda: [rand(2, 3, 5, 5)])


def test_running_statistics_land_in_the_module():
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(ConvBN().train())
    compiled = kiln_autograd.aot(gm, [rand(2, 3, 5, 5)], lambda g, _: g)
    before = gm.bn.running_mean.clone()
    compiled(rand(2, 3, 5, 5))
    assert not torch.equal(gm.bn.running_mean, before)
    assert int(gm.bn.num_batches_tracked) == 1


def test_dropout_uses_one_mask_in_forward_and_backward():
    torch.manual_seed(0)

    def drop(x):
        return (F.dropout(x, 0.5, training=True) * 3,)

    compiled = kiln_autograd.aot(torch.fx.symbolic_trace(drop), [rand(64)], lambda g, _: g)
    x = torch.rand(64).add_(0.1).requires_grad_(True)
    (y,) = compiled(x)
    y.sum().backward()
    kept = y != 0
    assert 0 < int(kept.sum()) < 64
    torch.testing.assert_close(x.grad, kept.float() * 6)


def test_parameter_of_an_unused_output_gets_none():
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(TwoHeads())
    compiled = kiln_autograd.aot(gm, [rand(2, 4)], lambda g, _: g)
    a, _ = compiled(rand(2, 4))
    a.sum().backward()
    assert gm.a.weight.grad is not None
    assert gm.b.weight.grad is None and gm.b.bias.grad is None


def no_grad_region_graph() -> torch.fx.GraphModule:
    """``z = (x * 2) under no_grad; return z * y + x`` as capture writes it."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.placeholder("y")
    graph.call_function(torch._C._set_grad_enabled, (False,))
    z = graph.call_function(operator.mul, (x, 2))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    out = graph.call_function(operator.add, (graph.call_function(operator.mul, (z, y)), x))
    graph.output((out, z))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_no_grad_region_inside_the_graph(check):
    check(no_grad_region_graph(), lambda: [rand(3, 4), rand(3, 4)])


def test_double_backward_raises_a_clear_error():
    compiled = kiln_autograd.aot(
        torch.fx.symbolic_trace(lambda x: (x.sin(),)), [rand(3)], lambda g, _: g
    )
    x = rand(3)
    (y,) = compiled(x)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


def scale_in_place(x, y):
    x.mul_(y.sigmoid())
    return (x.sum(0) * y,)


def copy_into(buf, y):
    buf.copy_(y * 2)
    return (y.cos(),)


@pytest.mark.parametrize("fn", [scale_in_place, copy_into])
def test_writes_that_autograd_sees_match_eager(fn):
    compiled = kiln_autograd.aot(
        torch.fx.symbolic_trace(fn), [rand(3, 4) * 1, rand(3, 4)], lambda g, _: g
    )
    leaves = [rand(3, 4), rand(3, 4)]
    ref_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    first_grad = fn is scale_in_place
    x, y = leaves[0] * 1 if first_grad else leaves[0].detach(), leaves[1]
    xr, yr = ref_leaves[0] * 1 if first_grad else ref_leaves[0].detach(), ref_leaves[1]
    (out,) = compiled(x, y)
    (expected,) = fn(xr, yr)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, xr)  # the write landed, with its autograd history
    assert x.requires_grad == xr.requires_grad
    weight = torch.randn_like(out)
    ((out * weight).sum() + (x * x).sum()).backward()
    ((expected * weight).sum() + (xr * xr).sum()).backward()
    for a, e in zip(leaves, ref_leaves, strict=True):
        assert (a.grad is None) == (e.grad is None)
        if e.grad is not None:
            torch.testing.assert_close(a.grad, e.grad)


def test_returning_a_mutated_input_that_requires_grad_is_refused():
    def bad(x):
        x.mul_(2)
        return (x,)

    with pytest.raises(kiln_autograd.UnsupportedError, match="input 0, which requires grad"):
        kiln_autograd.aot(torch.fx.symbolic_trace(bad), [rand(3) * 1], lambda g, _: g)


def test_writing_into_a_leaf_that_requires_grad_fails_as_in_eager():
    compiled = kiln_autograd.aot(
        torch.fx.symbolic_trace(scale_in_place), [rand(3, 4) * 1, rand(3, 4)], lambda g, _: g
    )
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        compiled(rand(3, 4), rand(3, 4))


def test_unknown_partitioner_is_refused():
    with pytest.raises(ValueError, match="min_cut"):
        kiln_autograd.aot(
            torch.fx.symbolic_trace(lambda x: (x,)), [rand(3)], lambda g, _: g, partitioner="x"
        )


def test_recompiles_when_requires_grad_changes():
    gm = torch.fx.symbolic_trace(lambda x, y: (x * y,))
    compiled = kiln_autograd.aot(gm, [rand(3), rand(3)], lambda g, _: g)
    x, y = rand(3), rand(3, grad=False)
    (out,) = compiled(x, y)
    out.sum().backward()
    torch.testing.assert_close(x.grad, y)
    assert len(compiled.runners) == 2


def test_a_mutated_input_passed_twice_is_refused():
    def add_into(x, y):
        x.add_(y)
        return (x * 2,)

    compiled = kiln_autograd.aot(
        torch.fx.symbolic_trace(add_into), [torch.randn(3), torch.randn(3)], lambda g, _: g
    )
    x = torch.randn(3)
    with pytest.raises(kiln_autograd.UnsupportedError, match="input 0.*shares memory with input 1"):
        compiled(x, x)


def test_an_unused_dropout_still_draws_as_in_eager():
    def drops(x):
        F.dropout(x, 0.5, training=True)  # drawn, never read
        return (F.dropout(x, 0.5, training=True) * x,)

    compiled = kiln_autograd.aot(torch.fx.symbolic_trace(drops), [rand(32)], lambda g, _: g)
    x = rand(32)
    torch.manual_seed(3)
    (out,) = compiled(x)
    torch.manual_seed(3)
    (expected,) = drops(x)
    torch.testing.assert_close(out, expected)


def test_inputs_in_one_storage_that_do_not_overlap_are_distinct():
    """Two outputs of one CUDA-graph replay share its block; a graph that writes one in
    place and reads the other runs as eager does. Overlapping views are still refused."""

    def mul_into(x, y):
        x.mul_(y)
        return (x + 1,)

    compiled = kiln_autograd.aot(
        torch.fx.symbolic_trace(mul_into), [torch.randn(4, 3), torch.randn(4, 3)], lambda g, _: g
    )
    block = torch.randn(30)
    x, y = block[:12].view(4, 3), block[12:24].view(4, 3)
    expected_x = x * y
    (out,) = compiled(x, y)
    torch.testing.assert_close(x, expected_x)
    torch.testing.assert_close(out, expected_x + 1)
    overlapping = block[6:18].view(4, 3)
    with pytest.raises(kiln_autograd.UnsupportedError, match="input 0.*shares memory with input 1"):
        compiled(block[:12].view(4, 3), overlapping)
