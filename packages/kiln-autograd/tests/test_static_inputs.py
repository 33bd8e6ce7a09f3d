"""Inputs a runtime may ignore: fused attention's seed and offset without dropout."""

import pytest
import torch

from kiln_autograd import unused_seed_inputs

aten = torch.ops.aten


def _backward_graph(dropout_p: float, seed_also_read: bool = False) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    q, seed, offset = g.placeholder("q"), g.placeholder("seed"), g.placeholder("offset")
    grads = g.call_function(
        aten._scaled_dot_product_efficient_attention_backward.default,
        (q, q, q, q, None, q, q, seed, offset, dropout_p, [True, True, True, False], False),
    )
    outputs = [g.call_function(lambda t, i: t[i], (grads, i)) for i in range(3)]
    if seed_also_read:
        outputs.append(g.call_function(aten.add.Tensor, (seed, 1)))
    g.output(tuple(outputs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


CASES = [(0.0, False, (1, 2)), (0.1, False, ()), (0.0, True, (2,))]


@pytest.mark.parametrize(("dropout_p", "also_read", "unused"), CASES)
def test_attention_seeds_without_dropout_are_unused(dropout_p, also_read, unused):
    assert unused_seed_inputs(_backward_graph(dropout_p, also_read)) == unused
