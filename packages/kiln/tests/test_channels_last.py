"""Channels-last activations around 2-D convolutions (kiln/layouts.py): on the CPU with
``options={"channels_last": True}`` (the default turns it on for inference graphs on CUDA
only; the GPU entry point runs the models that use it there)."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch

import kiln
from kiln import layouts


class ConvNet(torch.nn.Module):
    """Two convolutions (one grouped) with batch norm, a residual and a 4-D output."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.grouped = torch.nn.Conv2d(8, 8, 3, padding=1, groups=4)

    def forward(self, x):
        h = torch.relu(self.norm(self.stem(x)))
        return self.grouped(h) + h


class Flattening(ConvNet):
    """A ``view`` that channels-last strides do not allow."""

    def forward(self, x):
        out = super().forward(x)
        return out.view(out.shape[0], -1).softmax(-1)


def aten_source(folder, kind: str) -> str:
    (path,) = folder.glob(f"frame*/{kind}_aten.py")
    return path.read_text()


def compiled_against_eager(model_class, tmp_path, channels_last=True):
    torch.manual_seed(0)
    model = model_class()
    twin = copy.deepcopy(model)
    options = {"channels_last": channels_last, "debug_dir": str(tmp_path), "cache": False}
    compiled = kiln.compile(twin, options=options)
    x = torch.randn(4, 3, 10, 10)
    expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        actual = compiled(x)
    torch.testing.assert_close(actual, expected)
    assert actual.stride() == expected.stride()
    actual.square().mean().backward()
    expected.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
        assert q.grad.stride() == p.grad.stride(), name
    return aten_source(tmp_path, "forward"), aten_source(tmp_path, "backward")


def test_only_the_first_convolution_input_is_converted_and_outputs_come_as_eager(tmp_path):
    forward, backward = compiled_against_eager(ConvNet, tmp_path)
    # the graph's input once; the second convolution reads the first's layout as it is
    assert forward.count("memory_format = torch.channels_last") == 1
    assert forward.count("aten.convolution.default") == 2
    assert "memory_format = torch.contiguous_format" in forward  # the output, as eager's
    assert backward.count("aten.convolution_backward.default") == 2


def test_a_view_the_layout_forbids_traces_the_graph_as_captured(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kiln.fallbacks")
    forward, _ = compiled_against_eager(Flattening, tmp_path)
    assert "tracing the rewritten graph (channels-last) failed" in caplog.text
    assert "memory_format = torch.channels_last" not in forward
    assert "aten.convolution.default" in forward


def test_off_on_the_cpu_by_default(tmp_path):
    forward, _ = compiled_against_eager(ConvNet, tmp_path, channels_last=None)
    assert "memory_format = torch.channels_last" not in forward


def test_by_default_only_graphs_autograd_does_not_differentiate():
    weight = torch.randn(4, 3, 3, 3, requires_grad=True)
    assert layouts.wanted(None, [torch.randn(1, 3, 8, 8), weight]) == (False, False)
    with torch.no_grad():
        assert layouts.wanted(None, [torch.randn(1, 3, 8, 8), weight]) == (True, False)
    assert layouts.wanted(None, [torch.randn(1, 3, 8, 8), weight.detach()]) == (True, False)
    assert layouts.wanted(True, [weight]) == (True, True)
    assert layouts.wanted(False, []) == (False, False)


def test_a_graph_without_convolutions_is_left_alone():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    assert layouts.channels_last(gm, on_cpu=True) is None


def test_the_option_takes_true_false_or_none():
    with pytest.raises(TypeError, match="channels_last"):
        kiln.compile(ConvNet(), options={"channels_last": "yes"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_inference_is_laid_out_by_default_and_training_is_not(tmp_path):
    torch.manual_seed(0)
    model = ConvNet().cuda().to(torch.bfloat16).eval()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 3, 16, 16, device="cuda", dtype=torch.bfloat16)
    compiled = kiln.compile(twin, options={"debug_dir": str(tmp_path / "inference")})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        expected, actual = model(x), compiled(x)
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)
    assert actual.stride() == expected.stride()
    forward = aten_source(tmp_path / "inference", "forward")
    assert forward.count("memory_format = torch.channels_last") == 1

    fresh = copy.deepcopy(model).train()
    trained = kiln.compile(fresh, options={"debug_dir": str(tmp_path / "training")})
    trained(x).float().square().mean().backward()
    assert "memory_format = torch.channels_last" not in aten_source(
        tmp_path / "training", "forward"
    )
