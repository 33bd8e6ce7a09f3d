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
        region = torch.autocast("cpu", enabled=False)  # made, not entered, alive across
        os.getpid()  # a break (a C call): capture cannot rebuild it, so cannot resume
        del region
        return (self.head(self.body(x)) + 1.0).tanh()


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


# --- functions ---------------------------------------------------------------------------

projection = torch.nn.Linear(8, 8)


def activate(t):
    return (t.sin() * 2).relu()


@kiln.disable
def kept_eager(t):
    return t - 1


def unresumable(x):
    region = torch.autocast("cpu", enabled=False)  # not rebuilt after a graph (above)
    os.getpid()
    del region
    return kept_eager(activate(projection(x))) + 1.0


class Graphs:
    """A backend that runs each graph as captured and remembers which function it is from."""

    def __init__(self):
        self.functions = []

    def __call__(self, gm, example_inputs):
        from kiln.backends import _captured_function_name

        self.functions.append(_captured_function_name(gm))
        return gm.forward


def test_functions_and_modules_a_function_calls_compile_when_its_frame_cannot():
    graphs = Graphs()
    compiled = kiln.compile(unresumable, backend=graphs, options={"cache": False})
    x = torch.randn(5, 8)
    with pytest.warns(
        RuntimeWarning, match=r"unresumable runs eagerly .* \(activate, projection\)"
    ):
        torch.testing.assert_close(compiled(x), unresumable(x))
    assert sorted(graphs.functions) == ["Module._call_impl", "activate"]
    assert projection._compiled_call_impl is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # said once, compiled once
        fresh = torch.randn(5, 8)
        torch.testing.assert_close(compiled(fresh), unresumable(fresh))
    assert len(graphs.functions) == 2
    projection._compiled_call_impl = None


def helper_in_a_loop(x):
    for _ in range(100):
        # a break inside a loop of more than 64 items: the rest of the frame runs natively
        os.getpid()
        x = activate(x)
    return x


def test_the_rest_of_a_frame_that_runs_eagerly_calls_compiled_functions():
    graphs = Graphs()
    compiled = kiln.compile(helper_in_a_loop, backend=graphs, options={"cache": False})
    x = torch.randn(4)
    with pytest.warns(RuntimeWarning, match=r"the rest of helper_in_a_loop .* \(activate\)"):
        torch.testing.assert_close(compiled(x), helper_in_a_loop(x))
    assert graphs.functions == ["activate"]


class WithMethod(Wrapped):
    def encode(self, x):
        region = torch.autocast("cpu", enabled=False)  # not rebuilt after a graph (above)
        os.getpid()
        del region
        return self.body(x) + 1.0


def test_a_method_of_a_module_compiles_its_submodules_when_its_frame_cannot():
    torch.manual_seed(0)
    model = WithMethod()
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model.encode, backend=Graphs(), options={"cache": False})
    x = torch.randn(3, 8)
    with pytest.warns(RuntimeWarning, match=r"WithMethod.encode runs eagerly .* body, head"):
        torch.testing.assert_close(compiled(x), eager.encode(x))
    assert model.body._compiled_call_impl is not None
