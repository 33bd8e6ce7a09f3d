"""Ops whose output shape depends on the data (nonzero, boolean masks, masked_select,
unique, bincount, one-argument where) break the graph at capture, as ``.item()`` does: the
op runs between two compiled graphs, never the whole frame eagerly, and the result is
eager's, forward and backward."""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln

FRAMES = {
    "nonzero": lambda x: (x.nonzero().float() * 2).sum() + x.sin().sum(),
    "boolean_mask": lambda x: x.cos()[x > 0].exp().sum() * 2 + x.mean(),
    "masked_select": lambda x: torch.masked_select(x.sin(), x > 0).sum() + x.sum(),
    "unique": lambda x: torch.unique((x * 3).round()).float().sum() + x.tanh().sum(),
    "bincount": lambda x: torch.bincount((x.abs() * 3).long().flatten()).sum() + x.sum(),
    "where_one_argument": lambda x: torch.where(x > 0)[0].float().sum() + x.relu().sum(),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_the_op_runs_between_two_compiled_graphs(name, tmp_path):
    fn = FRAMES[name]
    compiled = kiln.compile(fn, options={"debug_dir": str(tmp_path), "cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an eager graph fails the test
        for _ in range(2):
            x = torch.randn(6, 5)
            torch.testing.assert_close(compiled(x), fn(x))
    # the graphs around the op (the one before it is empty where the op reads an input)
    kernels = list(tmp_path.rglob("forward_kernels.cpp"))
    assert kernels and all('extern "C"' in p.read_text() for p in kernels)


def test_gradients_flow_through_a_boolean_mask(tmp_path):
    def fn(x):
        return (x.sin()[x > 0] ** 2).sum() + x.cos().sum()

    compiled = kiln.compile(fn, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        x = torch.randn(6, 5)
        leaf, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
        compiled(leaf).backward()
        fn(reference).backward()
    torch.testing.assert_close(leaf.grad, reference.grad)
