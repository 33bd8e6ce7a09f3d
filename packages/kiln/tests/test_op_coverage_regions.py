"""The op-coverage corpus: autocast regions (CPU, bfloat16), ops whose output shape depends
on the data (the graph breaks around them; the graphs on either side compile), and NumPy
code on tensors. See test_op_coverage.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from op_corpus import Frame, check_frame

BF16 = {"rtol": 1.6e-2, "atol": 1e-2}  # a bfloat16 matmul, then float32 ops


def _autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def autocast_matmul(x, w):
    with _autocast():
        y = x.sin() @ w
    return y.float().tanh()


def autocast_linear_softmax(x, w, b):
    with _autocast():
        y = F.linear(x, w, b)
        return y.softmax(-1)  # softmax runs in float32 under autocast


def autocast_conv2d(x, w):
    with _autocast():
        return F.conv2d(x, w, padding=1).relu().sum((2, 3))


def autocast_bmm_then_layer_norm(a, b):
    with _autocast():
        y = torch.bmm(a, b)
        return F.layer_norm(y, (y.shape[-1],))


def autocast_disabled_inside(x, w):
    with _autocast():
        y = x @ w
        with torch.autocast("cpu", enabled=False):
            z = y.float() @ w.T  # float32 here
    return z * 2


def autocast_reductions(x):
    with _autocast():
        y = x @ x.T
        return y.sum(1), y.float().logsumexp(0), y.cumsum(0)


def numpy_where_clip(x):
    a = x.numpy()
    return np.where(a > 0, np.clip(a, 0.2, 1.0), np.exp(a)).max(axis=0)


def numpy_argmax_take(x):
    a = x.numpy()
    i = np.argmax(a, axis=1)
    return np.take_along_axis(a, i[:, None], axis=1) + a.std(axis=1, keepdims=True)


def numpy_matmul_norm(x, y):
    a, b = x.numpy(), y.numpy()
    c = a @ b.T
    return np.linalg.norm(c, axis=1) + np.tanh(c).mean()


FRAMES = {
    "autocast_matmul": Frame(autocast_matmul, ((4, 8), (8, 5)), **BF16),
    "autocast_linear_softmax": Frame(autocast_linear_softmax, ((3, 6), (4, 6), (4,)), **BF16),
    "autocast_conv2d": Frame(autocast_conv2d, ((1, 2, 5, 5), (3, 2, 3, 3)), **BF16),
    "autocast_bmm_then_layer_norm": Frame(
        autocast_bmm_then_layer_norm, ((2, 3, 4), (2, 4, 6)), rtol=3e-2, atol=3e-2
    ),
    "autocast_disabled_inside": Frame(
        autocast_disabled_inside, ((3, 4), (4, 4)), rtol=3e-2, atol=3e-2
    ),
    "autocast_reductions": Frame(autocast_reductions, ((4, 6),), rtol=3e-2, atol=5e-2),
    "nonzero": Frame(
        lambda x: (x.nonzero().float() * 2).sum() + x.sin().sum(),
        ((6, 5),),
        False,
        graph_breaks=True,
    ),
    "boolean_mask_index": Frame(
        lambda x: x.cos()[x > 0].exp().sum() * 2 + x.mean(), ((6, 5),), graph_breaks=True
    ),
    "masked_select": Frame(
        lambda x: torch.masked_select(x.sin(), x > 0).sum() + x.sum(),
        ((6, 5),),
        graph_breaks=True,
    ),
    "unique_counts": Frame(
        lambda x: torch.unique((x * 2).round().detach(), return_counts=True)[1].float().mean() + x,
        ((4, 5),),
        graph_breaks=True,
    ),
    "repeat_interleave_tensor_repeats": Frame(
        lambda x: torch.repeat_interleave(x.sin(), (x[:, 0].abs() * 3).long(), dim=0).sum(0),
        ((4, 3),),
        graph_breaks=True,
    ),
    "item_as_scale": Frame(lambda x: x.sin() * x.max().item(), ((4, 6),), graph_breaks=True),
    "numpy_where_clip": Frame(numpy_where_clip, ((4, 6),), False),
    "numpy_argmax_take": Frame(numpy_argmax_take, ((4, 6),), False),
    "numpy_matmul_norm": Frame(numpy_matmul_norm, ((4, 6), (3, 6)), False),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)
