"""Convolutions whose kernel tiles the image computed as matrix products
(kiln/patch_convolutions.py): the rewrite on traced graphs (on the CPU, with the device's
timing taken as "faster"), and a compiled patch embedding on CUDA against eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import patch_convolutions as patch_module
from kiln.patch_convolutions import patch_convolutions

F = torch.nn.functional
aten = torch.ops.aten


@pytest.fixture
def always_faster(monkeypatch):
    monkeypatch.setattr(patch_module, "_faster", lambda *shape: True)


def embed(x, w, b):  # a vision transformer's patch embedding, flattened to tokens
    return F.conv2d(x, w, b, stride=4).flatten(2).transpose(1, 2) * 2


def returned_conv(x, w):
    return F.conv2d(x, w, stride=(2, 3)), F.conv2d(x, w, stride=2, padding=1)


def traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def returned_layouts(gm):
    """The strides of the graph's outputs as its values give them (the compiled code's)."""
    (output,) = gm.graph.find_nodes(op="output")
    outputs = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    return [n.meta["val"].stride() for n in outputs]


def calls(gm, op):
    return [n for n in gm.graph.nodes if n.target is op]


@pytest.mark.parametrize("size", [16, 18])  # 18: two rows and columns past the last patch
def test_a_patch_embedding_is_a_product_of_the_patches(always_faster, size):
    x, w, b = torch.randn(2, 3, size, size), torch.randn(8, 3, 4, 4), torch.randn(8)
    rewritten = patch_convolutions(traced(embed, x, w, b), "cpu")
    assert rewritten is not None
    assert not calls(rewritten, aten.convolution.default)
    assert len(calls(rewritten, aten.addmm.default)) == 1
    got, want = rewritten(x, w, b), embed(x, w, b)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert returned_layouts(rewritten) == [want.stride()]  # what compiled code returns


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_a_returned_convolution_keeps_its_layout_and_overlapping_ones_stay(always_faster, layout):
    # a training forward returns what its backward reads, which reads it with these strides
    x, w = torch.randn(2, 5, 12, 12).to(memory_format=layout), torch.randn(6, 5, 2, 3)
    rewritten = patch_convolutions(traced(returned_conv, x, w), "cpu")
    assert rewritten is not None
    assert len(calls(rewritten, aten.convolution.default)) == 1  # padded: it overlaps edges
    for got, want in zip(rewritten(x, w), returned_conv(x, w), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert returned_layouts(rewritten) == [t.stride() for t in returned_conv(x, w)]


def test_pointwise_convolutions_and_ones_before_a_batch_norm_stay(always_faster):
    def pointwise(x, w):
        return F.conv2d(x, w) + 1  # 1 x 1, stride 1: cuDNN runs it as a product

    def normalized(x, w, mean, var):  # freezing folds the batch norm into the convolution
        conv = F.conv2d(x, w, stride=2)  # as kiln-autograd's graphs have it:
        return aten._native_batch_norm_legit_no_training(conv, None, None, mean, var, 0.1, 1e-5)[0]

    x = torch.randn(2, 4, 8, 8)
    assert patch_convolutions(traced(pointwise, x, torch.randn(6, 4, 1, 1)), "cpu") is None
    stats = torch.randn(6), torch.rand(6) + 0.5
    gm = traced(normalized, x, torch.randn(6, 4, 2, 2), *stats)
    assert patch_convolutions(gm, "cpu") is None


def test_slower_products_keep_the_convolution(monkeypatch):
    monkeypatch.setattr(patch_module, "_faster", lambda *shape: False)
    x, w, b = torch.randn(2, 3, 16, 16), torch.randn(8, 3, 4, 4), torch.randn(8)
    assert patch_convolutions(traced(embed, x, w, b), "cpu") is None


class PatchEmbed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 768, 16, stride=16)
        self.norm = torch.nn.LayerNorm(768)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("grad", [False, True])
def test_on_cuda_a_patch_embedding_runs_as_a_product(tmp_path, grad):
    torch.manual_seed(0)
    model = PatchEmbed().cuda().to(torch.bfloat16)
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    for _ in range(2):
        x = torch.randn(8, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
        probe = torch.randn(8, 196, 768, device="cuda")  # a loss that reads every output
        with torch.set_grad_enabled(grad), warnings.catch_warnings():
            warnings.simplefilter("error")  # a graph that runs eagerly warns
            got = compiled(x)
        want = model(x)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        if grad:
            (g,) = torch.autograd.grad((got.float() * probe).sum(), model.proj.weight)
            (w,) = torch.autograd.grad((want.float() * probe).sum(), model.proj.weight)
            torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-2 * w.abs().max().item())
    (rewritten,) = tmp_path.glob("frame*/*forward*_aten_rewritten.py") or tmp_path.glob(
        "frame*/*_aten_rewritten.py"
    )
    text = rewritten.read_text()
    assert "aten.convolution" not in text and "aten.addmm" in text
