"""Torch functions rewritten above autograd (kiln_autograd.pre_autograd): aminmax is traced as
amin and amax, with their gradients, on every torch version (torch 2.11 has no derivative
for aminmax; from 2.13 on it is amin's and amax's, ties sharing the gradient)."""

from __future__ import annotations

import pytest
import torch
import torch.fx

import kiln_autograd
from kiln_autograd import pre_autograd

aten = torch.ops.aten


def _aminmax_dim(x):
    found = torch.aminmax(x.sin(), dim=1, keepdim=True)
    return (found.min, found.max)


def _aminmax_method(x):
    found = x.aminmax()
    return (found[0] * x, found[1].exp())


def _amin_amax_dim(x):
    return (x.sin().amin(1, keepdim=True), x.sin().amax(1, keepdim=True))


def _amin_amax_method(x):
    return (x.amin() * x, x.amax().exp())


@pytest.mark.parametrize(
    "fn, same", [(_aminmax_dim, _amin_amax_dim), (_aminmax_method, _amin_amax_method)]
)
def test_aminmax_is_traced_as_amin_and_amax(fn, same):
    graphs = []

    def compiler(gm, example_inputs):
        kiln_autograd.verify_op_set(gm)
        graphs.append(gm)
        return gm

    # few distinct values: ties, which share the gradient
    x = torch.randint(-3, 3, (4, 6)).float().requires_grad_()
    compiled = kiln_autograd.aot(torch.fx.symbolic_trace(fn), [x], compiler)
    got = compiled(x)
    x_eager = x.detach().clone().requires_grad_()
    want = same(x_eager)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)
    weights = [torch.randn_like(e) for e in want]
    torch.autograd.backward(got, weights)
    torch.autograd.backward(want, weights)
    torch.testing.assert_close(x.grad, x_eager.grad)
    targets = {n.target for gm in graphs for n in gm.graph.nodes}
    assert aten.aminmax.default not in targets
    assert {aten.amin.default, aten.amax.default} <= targets


def _quantile_linear(x):
    return (torch.quantile(x.sin(), 0.3, dim=1) * 2,)


def _nanquantile_many(x):
    x = torch.where(x > 1, float("nan"), x)
    q = torch.tensor([0.1, 0.5, 0.9])
    return (x.nanquantile(q, dim=0, keepdim=True, interpolation="midpoint"),)


def _quantile_nearest_all(x):
    return (torch.quantile(x, torch.tensor(0.75), interpolation="nearest") + x,)


@pytest.mark.parametrize("fn", [_quantile_linear, _nanquantile_many, _quantile_nearest_all])
def test_quantile_is_traced_without_reading_q(check, fn):
    _, compiler = check(fn, lambda: [torch.randn(5, 6, requires_grad=True)])
    targets = {n.target for gm in compiler.graphs for n in gm.graph.nodes}
    assert aten.sort.default in targets
    assert aten.equal.default not in targets


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((torch.randn(4, 6), 0.3), {"dim": 1}),
        ((torch.randn(4, 6).double(), torch.tensor([0.0, 0.25, 1.0]).double()), {}),
        ((torch.randn(3, 5, 2), 1), {"dim": -2, "keepdim": True, "interpolation": "lower"}),
        ((torch.tensor(2.5), 0.5), {"keepdim": True}),
        ((torch.randn(4, 6), torch.tensor(0.4)), {"axis": 0, "interpolation": "higher"}),
    ],
)
def test_quantile_values_are_atens_bit_for_bit(args, kwargs):
    for name in ("quantile", "nanquantile"):
        x = args[0].clone()
        if x.ndim:
            x.view(-1)[::4] = float("nan")
        got = pre_autograd.PRE_AUTOGRAD_DECOMPOSITIONS[getattr(torch, name)](x, *args[1:], **kwargs)
        want = getattr(torch, name)(x, *args[1:], **kwargs)
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((torch.randn(4, 6), 1.5), {}),  # q out of range: eager's error
        ((torch.randn(4, 6), torch.tensor([0.5]).double()), {}),  # q of another dtype
        ((torch.randn(4, 6).long(), 0.5), {}),  # integers
        ((torch.randn(4, 6), 0.5), {"interpolation": "cubic"}),
    ],
)
def test_quantile_leaves_what_eager_rejects_to_torch(args, kwargs):
    assert pre_autograd.quantile(*args, **kwargs) is NotImplemented
    with pytest.raises(RuntimeError, match="quantile"), pre_autograd.PreAutogradDecompositions():
        torch.quantile(*args, **kwargs)


def test_a_tensor_q_out_of_range_raises_eagers_error_from_the_graph():
    def fn(x, q):
        return (torch.quantile(x, q, dim=1),)

    x, q = torch.randn(4, 6), torch.tensor([0.2, 0.7])
    compiled = kiln_autograd.aot(torch.fx.symbolic_trace(fn), [x, q], lambda gm, _: gm)
    torch.testing.assert_close(compiled(x, q)[0], fn(x, q)[0])
    with pytest.raises(RuntimeError, match=r"q values must be in the range \[0, 1\]"):
        compiled(x, torch.tensor([0.2, 1.5]))
