"""Ops whose output shape depends on the data (nonzero, boolean masks, masked_select,
unique, bincount, one-argument where) break the graph at capture, as ``.item()`` does: the
op runs between two compiled graphs, never the whole frame eagerly, and the result is
eager's, forward and backward. A frame with nothing else to compile runs eagerly with one
warning that says why and what to do."""

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
# frames whose op reads a value computed in the frame: a graph before it and one after
OP_OF_A_COMPUTED_VALUE = (
    "boolean_mask",
    "masked_select",
    "unique",
    "bincount",
    "where_one_argument",
)


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_the_op_runs_between_two_compiled_graphs(name, tmp_path):
    fn = FRAMES[name]
    compiled = kiln.compile(fn, options={"debug_dir": str(tmp_path), "cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an eager graph fails the test
        for call in range(2):
            x = torch.randn(6, 5)
            torch.testing.assert_close(compiled(x), fn(x))
            if call == 0:
                # the graphs around the op (none before it where the op reads an input)
                kernels = list(tmp_path.rglob("forward_kernels.cpp"))
                assert len(kernels) == (2 if name in OP_OF_A_COMPUTED_VALUE else 1)
    assert all('extern "C"' in p.read_text() for p in kernels)


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


NOTHING_ELSE = {
    "nonzero": lambda x, mask: x.nonzero(),
    "masked_select_of_arguments": lambda x, mask: torch.masked_select(x, mask),
    "boolean_mask_of_arguments": lambda x, mask: x[mask],
    "tolist": lambda x, mask: x.tolist(),
}


def same(got, expected):
    if isinstance(expected, list):
        assert got == expected
    else:
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", sorted(NOTHING_ELSE))
def test_a_frame_with_nothing_else_to_compile_says_it_runs_eagerly(name):
    fn = NOTHING_ELSE[name]
    compiled = kiln.compile(fn, options={"cache": False})
    x = torch.randn(6, 5)
    with pytest.warns(RuntimeWarning, match=r"runs <lambda> eagerly: .*data.*keep sizes fixed"):
        same(compiled(x, x > 0), fn(x, x > 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # said once
        fresh = torch.randn(6, 5)
        same(compiled(fresh, fresh > 0), fn(fresh, fresh > 0))
