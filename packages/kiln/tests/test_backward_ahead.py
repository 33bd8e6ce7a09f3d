"""A training step's backward graph compiled in a thread while its forward compiles
(kiln/backward_ahead.py): compiled before the first call returns, equal to eager, its
errors raised at the first backward as before."""

import copy
import threading

import pytest
import torch
from helpers import Block

import kiln
from kiln import pipeline


@pytest.fixture
def compiles(monkeypatch):
    """(kind, thread name, whether the first call had returned) of each aten graph compile."""
    seen: list[tuple[str, str]] = []
    real = pipeline.AtenCompiler._compile

    def compile_graph(self, gm, example_inputs):
        seen.append((self.kind, threading.current_thread().name))
        return real(self, gm, example_inputs)

    monkeypatch.setattr(pipeline.AtenCompiler, "_compile", compile_graph)
    return seen


def step(options):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cache": False, **options})
    return compiled, eager, x


def test_the_backward_compiles_in_a_thread_before_the_first_call_returns(compiles):
    compiled, eager, x = step({})
    out = compiled(x)
    # before any backward; the backward first (its kernels take the longest to build)
    assert [kind for kind, _ in compiles] == ["backward", "forward"]
    assert compiles[0][1] == "kiln backward compile" != compiles[1][1]
    out.square().sum().backward()
    eager(x).square().sum().backward()
    assert len(compiles) == 2  # the first backward compiled nothing more
    for p, q in zip(compiled.parameters(), eager.parameters(), strict=True):
        if q.grad is None:  # the unused Linear's
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert sum(kiln.compile_times().get(s, 0) for s in ("lowering", "build")) > 0


def test_backward_ahead_false_compiles_at_the_first_backward(compiles):
    compiled, eager, x = step({"backward_ahead": False})
    out = compiled(x)
    assert [kind for kind, _ in compiles] == ["forward"]
    out.sum().backward()
    assert [kind for kind, _ in compiles] == ["forward", "backward"]
    eager(x).sum().backward()
    torch.testing.assert_close(compiled.up.weight.grad, eager.up.weight.grad)


def test_a_module_in_eval_mode_compiles_its_backward_at_the_first_backward(compiles):
    compiled, eager, x = step({})
    compiled.eval()
    out = compiled(x)
    assert [kind for kind, _ in compiles] == ["forward"]
    out.sum().backward()
    assert [kind for kind, _ in compiles] == ["forward", "backward"]


def test_a_failed_backward_compile_raises_at_the_first_backward(monkeypatch):
    real = pipeline.AtenCompiler._compile

    def failing(self, gm, example_inputs):
        if self.kind == "backward":
            raise RuntimeError("kiln test: the backward does not compile")
        return real(self, gm, example_inputs)

    monkeypatch.setattr(pipeline.AtenCompiler, "_compile", failing)
    compiled, eager, x = step({"fallback": False})
    out = compiled(x)  # the forward ran: the backward's error waits for the backward
    torch.testing.assert_close(out, eager(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="the backward does not compile"):
        out.sum().backward()


def test_the_module_called_last_is_not_kept_alive():
    import gc
    import weakref

    model = Block()
    compiled = kiln.compile(model, options={"cache": False})
    compiled(torch.randn(4, 16)).sum().backward()
    alive = weakref.ref(model)
    del model, compiled
    gc.collect()
    assert alive() is None, "a compiled call kept its module alive"
