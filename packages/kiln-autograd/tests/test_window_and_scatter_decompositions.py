"""Kiln's decompositions of max_pool3d's gradient, adaptive average pooling's gradient over
tiling windows, and scatter_reduce with prod, amax and amin: the graphs no longer hold the
op, and forward and gradients agree with eager (NaN, repeated indices, include_self)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln_autograd

aten = torch.ops.aten
ROWS = torch.tensor([[4, 0, 2], [0, 0, 1], [4, 3, 3]])  # rows of (5, 3); row 0 repeats


def _run_as_traced(gm, example_inputs):
    kiln_autograd.verify_op_set(gm)
    assert aten.scatter_reduce.two not in {n.target for n in gm.graph.nodes}
    return gm


def _targets(compiler) -> set:
    return {n.target for gm in compiler.graphs for n in gm.graph.nodes}


@pytest.mark.parametrize("reduce", ["prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_is_a_table_reduction(check, reduce, include_self):
    def fn(x, src):
        return (x.scatter_reduce(0, ROWS, src * 2, reduce, include_self=include_self),)

    _, compiler = check(fn, lambda: [torch.randn(5, 3, requires_grad=True), torch.randn(3, 3)])
    assert aten.scatter_reduce.two not in _targets(compiler)


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_scatter_reduce_keeps_nan_as_eager_does(reduce):
    x, src = torch.randn(5, 3), torch.randn(3, 3)
    x[1, 2], src[2, 0] = float("nan"), float("nan")  # one NaN in place, one scattered

    def fn(x, src):
        return (x.scatter_reduce(0, ROWS, src, reduce),)

    compiled = kiln_autograd.aot(torch.fx.symbolic_trace(fn), [x, src], _run_as_traced)
    torch.testing.assert_close(compiled(x, src)[0], fn(x, src)[0], equal_nan=True)


def test_scatter_reduce_of_integers_along_the_last_dim(check):
    index = torch.tensor([[0, 3, 3, 1], [2, 2, 0, 0]])
    _, compiler = check(
        lambda x, s: (x.scatter_reduce(-1, index, s, "amin"),),
        lambda: [torch.randint(-9, 9, (2, 5)), torch.randint(-9, 9, (2, 4))],
    )
    assert aten.scatter_reduce.two not in _targets(compiler)


def test_max_pool3d_gradient_is_a_scatter_add(check):
    _, compiler = check(
        lambda x: (F.max_pool3d(x.exp(), 3, 2, 1, ceil_mode=True),),
        lambda: [torch.randn(1, 2, 5, 4, 5, requires_grad=True)],
    )
    assert aten.max_pool3d_with_indices_backward.default not in _targets(compiler)


@pytest.mark.parametrize("size, tiles", [((3, 2), True), (1, True), ((3, 4), False)])
def test_adaptive_avg_pool2d_gradient_over_tiling_windows(check, size, tiles):
    _, compiler = check(
        lambda x: (F.adaptive_avg_pool2d(x, size),),
        lambda: [torch.randn(2, 3, 6, 6, requires_grad=True)],
    )
    kept = aten._adaptive_avg_pool2d_backward.default in _targets(compiler)
    assert kept != tiles
