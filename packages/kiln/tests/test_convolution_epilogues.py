"""ReLUs after convolutions applied by cuDNN's fused convolution
(kiln/convolution_epilogues.py): the rewrite on traced graphs (on the CPU, with the
device's timing taken as "free"; ``kiln_loopir::convolution_relu`` runs through ATen
there), and a compiled ResNet block on CUDA against eager."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import convolution_epilogues as epilogue_module
from kiln.convolution_epilogues import relu_epilogues

F = torch.nn.functional
aten = torch.ops.aten
FUSED = torch.ops.kiln_loopir.convolution_relu.default


@pytest.fixture
def always_free(monkeypatch):
    monkeypatch.setattr(epilogue_module, "_free", lambda *shape: True)


def block_end(x, w1, b1, w2, b2):  # a residual block once its batch norms are folded
    y = F.relu(F.conv2d(x, w1, b1, padding=1))
    return F.relu(F.conv2d(y, w2, b2) + x)


def folded_block_end(x, w1, b1, w2, b2):  # as freezing leaves it: biases added per channel
    y = F.relu(F.conv2d(x, w1, padding=1) + b1.view(-1, 1, 1))
    return F.relu(F.conv2d(y, w2) + b2.view(-1, 1, 1) + x)


def rounded_block_end(x, w1, b1, w2, b2):  # a bfloat16 block's: float32 shifts, rounded
    y = F.relu((F.conv2d(x, w1, padding=1) + b1.view(-1, 1, 1)).to(x.dtype))
    return F.relu((F.conv2d(y, w2) + b2.view(-1, 1, 1)).to(x.dtype) + x)


def conv_read_twice(x, w, b):
    y = F.conv2d(x, w, b, padding=1)
    return F.relu(y), y * 2


def inputs(channels_last=False):
    x = torch.randn(2, 8, 10, 10)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return [x, torch.randn(8, 8, 3, 3) / 8, torch.randn(8), torch.randn(8, 8, 1, 1) / 3,
            torch.randn(8)]  # fmt: skip


def calls(gm, op):
    return [n for n in gm.graph.nodes if n.target is op]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("block", [block_end, folded_block_end])
def test_relus_after_convolutions_and_residuals_are_the_convolutions(
    always_free, block, channels_last
):
    args = inputs(channels_last)
    gm = make_fx(block, tracing_mode="fake")(*args)
    rewritten = relu_epilogues(gm, "cpu")
    assert rewritten is not None
    assert len(calls(rewritten, FUSED)) == 2
    assert not calls(rewritten, aten.convolution.default) and not calls(
        rewritten, aten.relu.default
    )
    (residual,) = [n for n in calls(rewritten, FUSED) if n.args[3] is not None]
    assert residual.args[3].name == "x_1"  # the block's input, added by the epilogue
    fresh = inputs(channels_last)
    got, want = rewritten(*fresh), block_end(*fresh)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()


def bfloat16_inputs(bias_dtype):
    x, w1, b1, w2, b2 = inputs(channels_last=True)
    return [x.bfloat16(), w1.bfloat16(), b1.to(bias_dtype), w2.bfloat16(), b2.to(bias_dtype)]


def test_a_bfloat16_blocks_float32_shifts_are_the_convolutions_biases(always_free):
    """Folded batch norms leave a bfloat16 convolution plus a float32 shift, rounded to
    bfloat16: the fused op takes the float32 shift (cuDNN's fused forms read a float32
    bias) and rounds the sum once, as eager does."""
    gm = make_fx(rounded_block_end, tracing_mode="fake")(*bfloat16_inputs(torch.float32))
    rewritten = relu_epilogues(gm, "cpu")
    assert rewritten is not None
    fused = calls(rewritten, FUSED)
    assert len(fused) == 2 and not calls(rewritten, aten._to_copy.default)
    assert all(n.args[2].meta["val"].dtype == torch.float32 for n in fused)
    fresh = bfloat16_inputs(torch.float32)
    got, want = rewritten(*fresh), rounded_block_end(*fresh)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same roundings on the CPU
    assert got.stride() == want.stride()


def test_a_bfloat16_bias_stays_apart(always_free):
    """cuDNN's fused forms read their bias as float32 (given bfloat16 they return values
    far off): a bias of the convolution's own narrower dtype keeps its ReLU apart."""
    gm = make_fx(block_end, tracing_mode="fake")(*bfloat16_inputs(torch.bfloat16))
    assert relu_epilogues(gm, "cpu") is None


def test_a_convolution_read_elsewhere_keeps_its_relu(always_free):
    x, w, b = inputs()[:3]
    assert relu_epilogues(make_fx(conv_read_twice, tracing_mode="fake")(x, w, b), "cpu") is None


def test_a_fused_form_that_costs_more_than_the_convolution_is_not_taken(monkeypatch):
    monkeypatch.setattr(epilogue_module, "_free", lambda *shape: False)
    gm = make_fx(block_end, tracing_mode="fake")(*inputs())
    assert relu_epilogues(gm, "cpu") is None


class Bottleneck(torch.nn.Module):
    """A ResNet bottleneck block, evaluated: batch norms fold into the convolutions."""

    def __init__(self, width=64):
        super().__init__()
        self.c1 = torch.nn.Conv2d(width, width // 4, 1, bias=False)
        self.n1 = torch.nn.BatchNorm2d(width // 4)
        self.c2 = torch.nn.Conv2d(width // 4, width // 4, 3, padding=1, bias=False)
        self.n2 = torch.nn.BatchNorm2d(width // 4)
        self.c3 = torch.nn.Conv2d(width // 4, width, 1, bias=False)
        self.n3 = torch.nn.BatchNorm2d(width)

    def forward(self, x):
        y = F.relu(self.n1(self.c1(x)))
        y = F.relu(self.n2(self.c2(y)))
        return F.relu(self.n3(self.c3(y)) + x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_bottleneck_runs_cudnns_fused_convolutions(tmp_path, monkeypatch, request):
    """With ``mode="max-autotune"``, cuDNN's layout and values are checked on the device as
    in any compile; its timing is taken as even (this block's convolutions are small
    enough for either to win)."""
    monkeypatch.setattr(epilogue_module, "device_time", lambda fn: 1.0)
    epilogue_module._free.cache_clear()
    request.addfinalizer(epilogue_module._free.cache_clear)  # no decision outlives the test
    torch.manual_seed(0)
    model = Bottleneck().cuda().to(torch.bfloat16).to(memory_format=torch.channels_last).eval()
    for norm in (model.n1, model.n2, model.n3):  # statistics other than the initial ones
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2)
    reference = copy.deepcopy(model).float()
    options = {"debug_dir": str(tmp_path), "cache": False}
    compiled = kiln.compile(model, mode="max-autotune", options=options)
    for _ in range(2):
        x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.bfloat16)
        x = x.to(memory_format=torch.channels_last)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")  # a graph that runs eagerly warns
            got = compiled(x)
            want = reference(x.float())
        scale = want.abs().max().item()
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2 * scale)
        assert got.stride() == want.stride()
    (rewritten,) = tmp_path.glob("frame*/*_aten_rewritten.py")
    assert rewritten.read_text().count("convolution_relu") >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_default_mode_times_no_fused_convolution(tmp_path, monkeypatch):
    """cuDNN builds a fused form at its first call (about a second per shape): only
    ``mode="max-autotune"`` pays for timing them."""

    def not_timed(*shape):
        raise AssertionError(f"timed a fused convolution {shape} in the default mode")

    monkeypatch.setattr(epilogue_module, "_free", not_timed)
    torch.manual_seed(0)
    model = Bottleneck().cuda().to(torch.bfloat16).eval()
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        got = compiled(x)
        want = model.float()(x.float())
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2 * scale)
    dumped = "".join(p.read_text() for p in tmp_path.glob("frame*/*.py"))
    assert "convolution_relu" not in dumped
