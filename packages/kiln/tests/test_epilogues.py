"""A tanh GELU after a matrix product computed in the product's epilogue (kiln/epilogues.py):
the rewrite on traced graphs (on the CPU, for the pattern and the wiring), and compiled
models on CUDA against eager."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.epilogues import gelu_epilogues

F = torch.nn.functional


def written_out_gelu(v):  # as GPT-2 writes it
    return (
        0.5 * v * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * torch.pow(v, 3.0))))
    )


def library_gelu(v):
    return F.gelu(v, approximate="tanh")


def traced(fn, *inputs):
    return make_fx(fn, tracing_mode="fake")(*inputs)


def linear_inputs(rows=(6, 5), k=16, n=24):
    return torch.randn(*rows, k), torch.randn(n, k) / 4, torch.randn(n)


@pytest.mark.parametrize("gelu", [written_out_gelu, library_gelu])
def test_a_gelu_after_a_linear_layer_moves_into_the_product(gelu):
    x, w, b = linear_inputs()

    def fn(x, w, b):
        return gelu(F.linear(x, w, b)) * 2

    rewritten = gelu_epilogues(traced(fn, x, w, b), "cpu")
    assert rewritten is not None
    assert "_addmm_activation" in rewritten.code and "tanh" not in rewritten.code
    assert "aten.gelu" not in rewritten.code
    # wired as the GELU was: on the CPU, ATen's _addmm_activation applies the exact GELU
    # (on CUDA the tanh one, the GPU test below)
    exact = F.gelu(F.linear(x, w, b)) * 2
    torch.testing.assert_close(rewritten(x, w, b), exact, rtol=1e-5, atol=1e-5)


def test_exact_gelu_stays():
    x, w, b = linear_inputs()
    assert gelu_epilogues(traced(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b), "cpu") is None


def test_a_product_read_elsewhere_stays():
    x, w, b = linear_inputs()

    def fn(x, w, b):
        h = F.linear(x, w, b)
        return written_out_gelu(h), h.sum()

    assert gelu_epilogues(traced(fn, x, w, b), "cpu") is None


def test_a_gelu_step_read_elsewhere_stays():
    x, w, b = linear_inputs()

    def fn(x, w, b):
        v = F.linear(x, w, b)
        cube = torch.pow(v, 3.0)
        return 0.5 * v * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * cube))), cube

    assert gelu_epilogues(traced(fn, x, w, b), "cpu") is None


def test_other_constants_and_other_devices_stay():
    x, w, b = linear_inputs()

    def almost(v):  # 0.04 for 0.044715: not a GELU
        return 0.5 * v * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.04 * v**3)))

    assert gelu_epilogues(traced(lambda x, w, b: almost(F.linear(x, w, b)), x, w, b), "cpu") is None
    graph = traced(lambda x, w, b: library_gelu(F.linear(x, w, b)), x, w, b)
    assert gelu_epilogues(graph, "cuda") is None  # its values are on the CPU


class MLP(torch.nn.Module):
    def __init__(self, gelu, width=64):
        super().__init__()
        self.up, self.down, self.gelu = (
            torch.nn.Linear(width, 4 * width),
            torch.nn.Linear(4 * width, width),
            gelu,
        )

    def forward(self, x):
        return x + self.down(self.gelu(self.up(x)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("gelu", [written_out_gelu, library_gelu])
@pytest.mark.parametrize("grad", [False, True])
def test_compiled_on_cuda_matches_eager(tmp_path, gelu, grad):
    torch.manual_seed(0)
    model = MLP(gelu).cuda().to(torch.bfloat16)
    twin = copy.deepcopy(model)
    compiled = kiln.compile(twin, options={"debug_dir": str(tmp_path), "cache": False})
    x = torch.randn(4, 32, 64, device="cuda", dtype=torch.bfloat16)
    with torch.set_grad_enabled(grad), warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        expected, actual = model(x), compiled(x)
    torch.testing.assert_close(actual.float(), expected.float(), rtol=2e-2, atol=2e-2)
    rewritten = "\n".join(p.read_text() for p in tmp_path.glob("frame*/forward_aten_rewritten.py"))
    if grad:  # the backward reads the product: the training forward keeps it
        assert "_addmm_activation" not in rewritten
        expected.float().square().mean().backward()
        actual.float().square().mean().backward()
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(q.grad.float(), p.grad.float(), rtol=3e-2, atol=3e-2)
    else:
        assert "_addmm_activation" in rewritten
