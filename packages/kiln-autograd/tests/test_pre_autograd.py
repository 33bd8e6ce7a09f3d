"""Torch functions rewritten above autograd (kiln_autograd.pre_autograd): aminmax is traced as
amin and amax, with their gradients, on every torch version (torch 2.11 has no derivative
for aminmax; from 2.13 on it is amin's and amax's, ties sharing the gradient)."""

from __future__ import annotations

import pytest
import torch
import torch.fx

import kiln_autograd

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
