"""Kiln's max pooling (kiln_autograd.max_pooling) picks the values and indices ATen's kernels
pick: the first of equal maxima, the last NaN, the first position inside the input when the
window holds only the dtype's lowest value; and the traced graphs hold no pooling op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln_autograd import max_pooling

aten = torch.ops.aten
NAN, INF = float("nan"), float("inf")

# (input size, kernel, stride, padding, dilation, ceil_mode)
CONFIGS_2D = [
    ((2, 3, 6, 6), 2, 2, 0, 1, False),
    ((1, 2, 6, 7), 3, 2, 1, 1, True),
    ((2, 7, 9), (3, 2), (2, 1), (1, 0), (2, 1), False),  # no batch dimension
    ((1, 1, 5, 8), (2, 3), (3, 2), (1, 1), (1, 2), True),
    ((2, 2, 4, 4), 4, 1, 2, 1, False),  # windows wider than the input
]
CONFIGS_3D = [
    ((1, 2, 5, 4, 5), 3, 2, 1, 1, True),
    ((2, 4, 4, 4), 2, 2, 0, 1, False),
    ((1, 1, 6, 5, 4), (2, 3, 2), (1, 2, 2), (1, 1, 0), (2, 1, 1), True),
]


def _inputs(size, dtype=torch.float32, channels_last=False):
    torch.manual_seed(0)
    if dtype.is_floating_point:
        # few distinct values: many ties; NaN and infinities in places
        x = torch.randint(-3, 3, size).to(dtype)
        flat = x.view(-1)
        flat[::7] = -INF
        flat[3::11] = NAN
        flat[5::13] = INF
    else:
        x = torch.randint(-3, 3, size, dtype=dtype)
        x.view(-1)[::5] = torch.iinfo(dtype).min
    if channels_last and x.ndim in (4, 5):
        fmt = torch.channels_last if x.ndim == 4 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    return x


def _compare(decomposition, op, x, args):
    values, indices = decomposition(x, *args)
    want_values, want_indices = op(x, *args)
    torch.testing.assert_close(values, want_values, equal_nan=True)
    torch.testing.assert_close(indices, want_indices)
    assert values.stride() == want_values.stride()


@pytest.mark.parametrize("config", CONFIGS_2D)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool2d_values_and_indices_are_atens(config, dtype, channels_last):
    size, *args = config
    x = _inputs(size, dtype, channels_last)
    _compare(max_pooling.max_pool2d_with_indices, aten.max_pool2d_with_indices, x, args)


@pytest.mark.parametrize("config", CONFIGS_3D)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_max_pool3d_values_and_indices_are_atens(config, dtype):
    size, *args = config
    _compare(
        max_pooling.max_pool3d_with_indices,
        aten.max_pool3d_with_indices,
        _inputs(size, dtype),
        args,
    )


def test_a_window_of_lowest_values_points_at_its_first_position_inside_the_input():
    x = torch.tensor([[[[-INF, -INF, -INF, 1.0]]]])
    args = ((1, 2), 1, (0, 1), 1, False)
    _compare(max_pooling.max_pool2d_with_indices, aten.max_pool2d_with_indices, x, args)


@pytest.mark.parametrize(
    "n_dim, config", [(2, c) for c in CONFIGS_2D] + [(3, c) for c in CONFIGS_3D]
)
def test_max_pool_gradient_is_atens(n_dim, config):
    size, *args = config
    x = torch.randn(size, dtype=torch.float64)
    x.view(-1)[::3] = 0.5  # ties: overlapping windows pick one of them
    op = aten.max_pool2d_with_indices if n_dim == 2 else aten.max_pool3d_with_indices
    backward = (
        aten.max_pool2d_with_indices_backward
        if n_dim == 2
        else aten.max_pool3d_with_indices_backward
    )
    values, indices = op(x, *args)
    grad = torch.randn_like(values)
    want = backward(grad, x, *args, indices)
    got = max_pooling.max_pool_with_indices_backward(grad, x, indices, n_dim)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "fn, size",
    [
        (lambda x: (F.max_pool1d(x.sin(), 3, 2) * 2,), (2, 3, 9)),
        (lambda x: (F.max_pool2d(x, 3, 2, 1, ceil_mode=True).exp(),), (1, 2, 6, 7)),
        (lambda x: F.max_pool2d(x.cos(), 2, return_indices=True), (2, 2, 6, 6)),
        (lambda x: (F.max_pool3d(x.exp(), 3, 2, 1, ceil_mode=True),), (1, 2, 5, 4, 5)),
    ],
)
def test_max_pooling_traces_to_pointwise_ops_and_a_scatter_add(check, fn, size):
    _, compiler = check(fn, lambda: [torch.randn(size, requires_grad=True)])
    targets = {n.target for gm in compiler.graphs for n in gm.graph.nodes}
    pooling = {
        aten.max_pool2d_with_indices.default,
        aten.max_pool3d_with_indices.default,
        aten.max_pool2d_with_indices_backward.default,
        aten.max_pool3d_with_indices_backward.default,
    }
    assert not targets & pooling
