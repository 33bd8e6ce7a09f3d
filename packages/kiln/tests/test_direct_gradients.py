"""options={"direct_gradients": True}: the compiled backward writes the parameters'
gradients into ``.grad`` itself (kiln_autograd.direct_gradients), with eager's values."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import Block, copy_of

import kiln
from kiln_autograd.direct_gradients import leaves_reached


def accumulators_reached(out: torch.Tensor) -> set[int]:
    """ids of the leaves whose accumulator autograd's graph reaches from ``out``."""
    return {id(v) for v in leaves_reached(out)}


def train_side_by_side(device: str, tmp_path, steps: int = 4, **compile_args):
    torch.manual_seed(0)
    model = Block().to(device)
    reference = copy_of(model).to(device)
    compiled = kiln.compile(
        model,
        options={"direct_gradients": True, "debug_dir": str(tmp_path), "cache": False},
        **compile_args,
    )
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for _ in range(steps):
        x = torch.randn(8, 16, device=device)
        weight = torch.randn(8, 16, device=device)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a graph that runs eagerly warns
            out = compiled(x)
        reached = accumulators_reached(out)
        assert not reached & {id(p) for p in model.parameters()}, "parameters still in the graph"
        (out * weight).sum().backward()
        (reference(x) * weight).sum().backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)
        for opt in optimizers:
            opt.step()
    assert list(tmp_path.glob("frame*/backward_*host*")), "no compiled backward"
    return model, reference


def test_training_steps_match_eager_on_the_cpu(tmp_path):
    train_side_by_side("cpu", tmp_path)


def test_option_is_checked():
    with pytest.raises(TypeError, match="'direct_gradients'.*bool"):
        kiln.compile(Block(), options={"direct_gradients": "yes"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_training_steps_match_eager_on_cuda(tmp_path, mode):
    train_side_by_side("cuda", tmp_path, steps=6, mode=mode)
