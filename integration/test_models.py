"""Hugging Face models (small configs, random weights) through the whole Kiln stack on the
CPU — capture, autograd, loop IR, C++ kernels — against eager: inference, and one
training step (loss, logits, which parameters get a gradient and each gradient, the
parameters after an SGD step)."""

from __future__ import annotations

import copy
import pathlib
import sys

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from models import SUITE  # noqa: E402

import kiln  # noqa: E402

# float32; the generated reductions accumulate in another order than ATen's
OUTPUT_TOL = {"rtol": 1e-4, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-3, "atol": 1e-5}


@pytest.fixture(autouse=True)
def fresh_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cpp"))
    kiln.reset()


def build(name):
    torch.manual_seed(0)
    model, make_inputs = SUITE[name]()
    return model, copy.deepcopy(model), make_inputs


def assert_generated_code(tmp_path):
    kernels = list(tmp_path.glob("frame*/forward_kernels.cpp"))
    assert kernels and any('extern "C"' in k.read_text() for k in kernels), (
        "the graph ran through generated kernels, not eagerly"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SUITE))
def test_inference_matches_eager(name, tmp_path):
    model, reference, make_inputs = build(name)
    model.eval()
    reference.eval()
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path)})
    for _ in range(2):  # the second call reuses the compiled graph
        inputs = make_inputs()
        with torch.no_grad():
            out, expected = compiled(**inputs), reference(**inputs)
        torch.testing.assert_close(out.logits, expected.logits, **OUTPUT_TOL)
        torch.testing.assert_close(out.loss, expected.loss, **OUTPUT_TOL)
    assert_generated_code(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SUITE))
def test_training_step_matches_eager(name, tmp_path):
    model, reference, make_inputs = build(name)
    model.train()
    reference.train()
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path)})
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.1)
    optimizer_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    inputs = make_inputs()

    out = compiled(**inputs)
    out.loss.backward()
    expected = reference(**inputs)
    expected.loss.backward()

    torch.testing.assert_close(out.loss, expected.loss, **OUTPUT_TOL)
    torch.testing.assert_close(out.logits, expected.logits, **OUTPUT_TOL)
    params = dict(model.named_parameters())
    params_ref = dict(reference.named_parameters())
    with_grad = {n for n, p in params.items() if p.grad is not None}
    with_grad_ref = {n for n, p in params_ref.items() if p.grad is not None}
    assert with_grad == with_grad_ref, "the same parameters get a gradient"
    for n in sorted(with_grad):
        torch.testing.assert_close(params[n].grad, params_ref[n].grad, **GRAD_TOL, msg=n)

    optimizer.step()
    optimizer_ref.step()
    for n, p in params.items():
        torch.testing.assert_close(p, params_ref[n], **GRAD_TOL, msg=n)
    assert (tmp_path / "frame000" / "backward_kernels.cpp").exists()
    assert_generated_code(tmp_path)
