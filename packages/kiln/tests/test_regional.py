"""A module whose own frame capture gives up on still runs compiled code: each of its
direct submodules is compiled on its own, with one warning that says so."""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

import kiln


class Wrapped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU())
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        offset = 1.0
        shift = lambda t: t + offset  # noqa: E731  (a closure: forward has a cell)
        os.getpid()  # a C call capture cannot trace: a break it cannot resume (the cell)
        return shift(self.head(self.body(x))).tanh()


def test_submodules_compile_when_the_frame_cannot(tmp_path):
    torch.manual_seed(0)
    model = Wrapped()
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    x = torch.randn(5, 8)
    with pytest.warns(RuntimeWarning, match=r"Wrapped.forward runs eagerly .* body, head"):
        torch.testing.assert_close(compiled(x), eager(x))
    assert model.body._compiled_call_impl is not None
    assert model.head._compiled_call_impl is not None
    kernels = list(tmp_path.rglob("forward_kernels.cpp"))
    assert len(kernels) == 2  # one graph per submodule
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # said once
        fresh = torch.randn(5, 8)
        leaf, reference = fresh.clone().requires_grad_(), fresh.clone().requires_grad_()
        compiled(leaf).square().sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        eager(reference).square().sum().backward()
    torch.testing.assert_close(leaf.grad, reference.grad)
    for name, p in eager.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)


def test_a_captured_frame_leaves_its_submodules_alone():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    compiled = kiln.compile(model, options={"cache": False})
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert all(m._compiled_call_impl is None for m in model.children())
