"""Shared checks: run a graph compiled by kiln_autograd and eagerly, and compare everything."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.fx

import kiln_autograd

TOLERANCES = {
    torch.float32: {"rtol": 1.3e-5, "atol": 1e-5},
    torch.float64: {"rtol": 1e-7, "atol": 1e-7},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
    torch.float16: {"rtol": 1e-3, "atol": 1e-3},
}


class RecordingCompiler:
    """A compiler that checks each graph it is given against the op set, then runs it as is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        kiln_autograd.verify_op_set(gm)
        for node in gm.graph.nodes:
            if node.op not in ("output",):
                assert "val" in node.meta, f"{node.format_node()} has no fake value"
        self.graphs.append(gm)
        return gm


# Half-precision dtypes: a gradient that sums many rounded products (a matmul over the batch,
# batch norm's mean subtraction) carries rounding error in proportion to its largest terms,
# so an element that cancels to near zero cannot be compared on its own. Their gradients are
# compared normwise: the absolute tolerance grows to rtol times the largest expected magnitude.
NORMWISE_GRADS = {torch.bfloat16, torch.float16}


def close(
    actual: object, expected: object, what: str, scale: float = 1.0, *, grad: bool = False
) -> None:
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, what
        return
    assert isinstance(actual, torch.Tensor), what
    tol = TOLERANCES.get(expected.dtype, {"rtol": 0, "atol": 0})
    tol = {k: v * scale for k, v in tol.items()}
    if grad and expected.dtype in NORMWISE_GRADS and expected.numel():
        largest = expected.detach().abs().max().item()
        tol["atol"] = max(tol["atol"], tol["rtol"] * largest)
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tol)


def clone_inputs(inputs: list) -> list:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out.append(x.detach().clone().requires_grad_(x.requires_grad))
        else:
            out.append(x)
    return out


def check_against_eager(
    module: torch.nn.Module | Callable,
    make_inputs: Callable[[], list],
    *,
    calls: int = 2,
    tolerance_scale: float = 1.0,
    partitioner: str = "min_cut",
    seed: int = 0,
    trace: bool = True,
    direct_gradients: bool = False,
) -> tuple[kiln_autograd.AOTCompiled, RecordingCompiler]:
    """Compile ``module`` (symbolically traced if it is not a GraphModule) and compare it
    with eager on fresh random inputs: outputs, their requires_grad, mutated inputs, buffers,
    input gradients and parameter gradients (None where eager gives None). ``trace=False``
    hands a module to ``aot`` as it is (a model that ``torch.fx.symbolic_trace`` cannot
    trace, such as a Hugging Face model)."""
    gm = module
    if trace and not isinstance(module, torch.fx.GraphModule):
        gm = torch.fx.symbolic_trace(module)
    reference = copy.deepcopy(gm)
    compiler = RecordingCompiler()
    compiled = kiln_autograd.aot(
        gm, make_inputs(), compiler, partitioner=partitioner, direct_gradients=direct_gradients
    )
    for call in range(calls):
        inputs = make_inputs()
        ref_inputs = clone_inputs(inputs)
        torch.manual_seed(seed + call)
        out = compiled(*inputs)
        torch.manual_seed(seed + call)
        expected = reference(*ref_inputs)
        outs = out if isinstance(expected, tuple) else (out,)
        exps = expected if isinstance(expected, tuple) else (expected,)
        assert type(out) is type(expected)
        assert len(outs) == len(exps)
        for k, (a, e) in enumerate(zip(outs, exps, strict=True)):
            close(a, e, f"output {k}", tolerance_scale)
            if isinstance(e, torch.Tensor):
                assert a.requires_grad == e.requires_grad, f"output {k} requires_grad"
        for i, (a, e) in enumerate(zip(inputs, ref_inputs, strict=True)):
            close(a, e, f"input {i} after the call", tolerance_scale)
        for (name, a), (_, e) in zip(gm.named_buffers(), reference.named_buffers(), strict=True):
            close(a, e, f"buffer {name}", tolerance_scale)

        weights = [
            torch.randn_like(e) if e.requires_grad else None
            for e in exps
            if isinstance(e, torch.Tensor)
        ]
        if not torch.is_grad_enabled() or not any(w is not None for w in weights):
            continue
        loss_a = sum((a * w).sum() for a, w in zip(outs, weights, strict=False) if w is not None)
        loss_e = sum((e * w).sum() for e, w in zip(exps, weights, strict=False) if w is not None)
        loss_a.backward()
        loss_e.backward()
        for i, (a, e) in enumerate(zip(inputs, ref_inputs, strict=True)):
            if isinstance(e, torch.Tensor) and e.requires_grad:
                assert (a.grad is None) == (e.grad is None), f"input {i} grad presence"
                if e.grad is not None:
                    close(a.grad, e.grad, f"grad of input {i}", tolerance_scale, grad=True)
        pairs = zip(gm.named_parameters(), reference.named_parameters(), strict=True)
        for (name, a), (_, e) in pairs:
            assert (a.grad is None) == (e.grad is None), f"grad presence of {name}"
            if e.grad is not None:
                close(a.grad, e.grad, f"grad of {name}", tolerance_scale, grad=True)
            a.grad = None
            e.grad = None
    return compiled, compiler


@pytest.fixture
def check():
    return check_against_eager
