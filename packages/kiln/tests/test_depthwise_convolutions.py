"""Depthwise convolutions as sums of shifted products (kiln/depthwise_convolutions.py): the
rewrite on traced graphs on the CPU against the convolution, and compiled on CUDA (a
MobileNet-like and a ConvNeXt-like block, inference and a training step) against eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.depthwise_convolutions import depthwise_as_sums

F = torch.nn.functional
aten = torch.ops.aten


def traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def convolutions(gm):
    return [n for n in gm.graph.nodes if n.target is aten.convolution.default]


def returned_layouts(gm):
    (output,) = gm.graph.find_nodes(op="output")
    outputs = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    return [n.meta["val"].stride() for n in outputs]


CASES = [  # kernel, stride, padding, dilation, bias
    (3, 1, 1, 1, True),
    (3, 2, 1, 1, False),
    (5, 2, 2, 1, True),
    (5, 1, 2, 1, True),
    (3, 1, 2, 2, False),
    ((1, 5), 1, (0, 2), 1, True),
]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize(("kernel", "stride", "padding", "dilation", "bias"), CASES)
def test_a_depthwise_convolution_is_a_sum_of_shifted_products(
    layout, kernel, stride, padding, dilation, bias
):
    channels = 6
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    x = torch.randn(2, channels, 11, 13).contiguous(memory_format=layout)
    w = torch.randn(channels, 1, kh, kw)
    b = torch.randn(channels) if bias else None

    def block(x, w, b):
        y = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=channels)
        return torch.relu(y) * 2

    rewritten = depthwise_as_sums(traced(block, x, w, b), "cpu")
    assert rewritten is not None and not convolutions(rewritten)
    torch.testing.assert_close(rewritten(x, w, b), block(x, w, b), rtol=1e-5, atol=1e-5)


def test_in_bfloat16_the_sum_is_taken_in_float32():
    channels = 16
    x = torch.randn(2, channels, 14, 14, dtype=torch.bfloat16)
    w = torch.randn(channels, 1, 5, 5, dtype=torch.bfloat16)

    def block(x, w):
        return F.conv2d(x, w, padding=2, groups=channels)

    rewritten = depthwise_as_sums(traced(block, x, w), "cpu")
    assert rewritten is not None
    exact = F.conv2d(x.float(), w.float(), padding=2, groups=channels)
    got = rewritten(x, w)
    assert got.dtype == torch.bfloat16
    # rounded once: within one bfloat16 step of the float32 result
    torch.testing.assert_close(got.float(), exact, rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_a_returned_convolution_keeps_its_layout(layout):
    x = torch.randn(2, 4, 9, 9).contiguous(memory_format=layout)
    w = torch.randn(4, 1, 3, 3)

    def block(x, w):
        return F.conv2d(x, w, padding=1, groups=4)

    rewritten = depthwise_as_sums(traced(block, x, w), "cpu")
    want = block(x, w)
    assert returned_layouts(rewritten) == [want.stride()]
    torch.testing.assert_close(rewritten(x, w), want, rtol=1e-5, atol=1e-5)


def test_grouped_dense_and_transposed_convolutions_stay():
    x = torch.randn(2, 8, 10, 10)

    def block(x, grouped, dense, multiplier, transposed):
        a = F.conv2d(x, grouped, padding=1, groups=4)  # two channels a group
        b = F.conv2d(x, dense, padding=1)
        c = F.conv2d(x, multiplier, padding=1, groups=8)  # two outputs per channel
        d = F.conv_transpose2d(x, transposed, padding=1, groups=8)
        return a, b, c, d

    weights = (
        torch.randn(8, 2, 3, 3),
        torch.randn(8, 8, 3, 3),
        torch.randn(16, 1, 3, 3),
        torch.randn(8, 1, 3, 3),
    )
    assert depthwise_as_sums(traced(block, x, *weights), "cpu") is None


def test_a_kernel_of_more_than_25_taps_stays():  # ConvNeXt's 7 x 7: slower as a sum
    x, w = torch.randn(1, 4, 12, 12), torch.randn(4, 1, 7, 7)
    gm = traced(lambda x, w: F.conv2d(x, w, padding=3, groups=4), x, w)
    assert depthwise_as_sums(gm, "cpu") is None


class DepthwiseBlock(torch.nn.Module):
    """MobileNet's depthwise convolutions: 5 x 5 with a stride, batch norm and hard swish,
    then 3 x 3 with a bias."""

    def __init__(self, channels: int = 32):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, 5, stride=2, padding=2, groups=channels)
        self.norm = torch.nn.BatchNorm2d(channels)
        self.dw3 = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)

    def forward(self, x):
        return self.dw3(F.hardswish(self.norm(self.dw(x))))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("grad", [False, True])
def test_on_cuda_depthwise_convolutions_run_as_generated_kernels(tmp_path, grad):
    torch.manual_seed(0)
    model = DepthwiseBlock().cuda().to(torch.bfloat16).train(grad)
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    for _ in range(2):
        x = torch.randn(8, 32, 56, 56, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        probe = torch.randn(8, 32, 28, 28, device="cuda")  # a loss that reads every output
        with torch.set_grad_enabled(grad), warnings.catch_warnings():
            warnings.simplefilter("error")  # a graph that runs eagerly warns
            got = compiled(x)
        want = model(x)
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
        if grad:
            (g,) = torch.autograd.grad((got.float() * probe).sum(), model.dw.weight)
            (w,) = torch.autograd.grad((want.float() * probe).sum(), model.dw.weight)
            torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-2 * w.abs().max().item())
    (rewritten,) = tmp_path.glob("frame*/forward_aten_rewritten.py")
    assert "aten.convolution" not in rewritten.read_text()
