"""Inference graphs read their parameters and buffers as constants (kiln/freezing.py,
kiln/folding.py): batch norm folded into the convolution before it, what the state alone
computes done once, and done again after the state is written in place."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch

import kiln


class ConvBlock(torch.nn.Module):
    """Convolution, batch norm, ReLU; a second convolution (no bias) and batch norm."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.pointwise = torch.nn.Conv2d(8, 8, 1, bias=False)
        self.norm2 = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return self.norm2(self.pointwise(torch.relu(self.norm(self.conv(x)))))


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in evaluation mode with random batch-norm statistics and affine weights
    (fresh batch norms are the identity, which would hide a wrong fold)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
    return model.eval()


def seeded_block() -> tuple[ConvBlock, torch.Tensor]:
    """A :class:`ConvBlock` with random statistics and an input, the same at every test."""
    torch.manual_seed(0)
    return randomized(ConvBlock()), torch.randn(2, 3, 12, 12)


def compile_with_dumps(model, tmp_path, **options):
    options = {"debug_dir": str(tmp_path), "cache": False, **options}
    return kiln.compile(model, options=options)


def frozen_source(folder) -> str:
    (path,) = folder.glob("frame*/forward_frozen.py")
    return path.read_text()


def run_graph(source: str) -> str:
    """The part of a frozen dump that runs at every call."""
    return source.split("# run at every call")[1]


def call_without_fallback(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        return fn(*args)


def test_batch_norms_fold_into_the_convolutions_before_them(tmp_path):
    model, x = seeded_block()
    compiled = compile_with_dumps(copy.deepcopy(model), tmp_path)
    with torch.no_grad():
        expected = model(x)
        actual = call_without_fallback(compiled, x)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    source = frozen_source(tmp_path)
    assert "_native_batch_norm_legit_no_training" not in source
    assert run_graph(source).count("aten.convolution.default") == 2
    assert "aten.rsqrt" in source.split("# run at every call")[0]  # the fold, computed once


def test_a_write_in_place_to_the_state_is_seen_at_the_next_call(tmp_path):
    model, x = seeded_block()
    compiled = compile_with_dumps(model, tmp_path)
    with torch.no_grad():
        first = call_without_fallback(compiled, x)
        model.conv.weight.mul_(-0.5)  # as an optimizer step would
        model.norm2.running_var.add_(3.0)
        model.norm.bias.copy_(torch.randn(8))
        expected = model.forward(x)
        actual = call_without_fallback(compiled, x)
    assert not torch.allclose(first, expected, atol=1e-3)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert "forward_frozen.py" in {p.name for p in tmp_path.glob("frame*/*")}


def test_loaded_weights_and_a_new_parameter_are_read(tmp_path):
    model, x = seeded_block()
    compiled = compile_with_dumps(model, tmp_path)
    with torch.no_grad():
        call_without_fallback(compiled, x)
        model.load_state_dict(randomized(ConvBlock()).state_dict())
        torch.testing.assert_close(compiled(x), model.forward(x), rtol=1e-5, atol=1e-5)
        model.pointwise.weight = torch.nn.Parameter(torch.randn(8, 8, 1, 1))
        torch.testing.assert_close(compiled(x), model.forward(x), rtol=1e-5, atol=1e-5)


def test_freezing_off_reads_the_state_at_every_call(tmp_path):
    model, x = seeded_block()
    compiled = compile_with_dumps(copy.deepcopy(model), tmp_path, freezing=False)
    with torch.no_grad():
        torch.testing.assert_close(call_without_fallback(compiled, x), model(x))
    assert not list(tmp_path.glob("frame*/forward_frozen.py"))
    (aten,) = tmp_path.glob("frame*/forward_aten.py")
    assert "_native_batch_norm_legit_no_training" in aten.read_text()


def test_a_training_step_is_not_frozen(tmp_path):
    model, x = seeded_block()
    twin = copy.deepcopy(model)
    compiled = compile_with_dumps(twin, tmp_path)
    for _ in range(2):  # the parameters change between the steps
        expected = model(x)
        actual = call_without_fallback(compiled, x)
        torch.testing.assert_close(actual, expected)
        expected.square().mean().backward()
        actual.square().mean().backward()
        with torch.no_grad():
            for p, q in zip(model.parameters(), twin.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad)
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
    assert not list(tmp_path.glob("frame*/forward_frozen.py"))


def test_buffers_the_graph_writes_are_not_frozen(tmp_path):
    torch.manual_seed(0)
    model = randomized(ConvBlock()).train()  # batch norm updates its running statistics
    twin = copy.deepcopy(model)
    compiled = compile_with_dumps(twin, tmp_path)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(call_without_fallback(compiled, x), model(x))
    torch.testing.assert_close(twin.norm.running_mean, model.norm.running_mean)
    torch.testing.assert_close(twin.norm2.running_var, model.norm2.running_var)


class StateOutput(torch.nn.Module):
    """An output computed from the parameters alone, and a cast of a weight."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4))
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        weight = self.linear.weight.to(torch.float64).exp()  # state alone: computed once
        return x.to(torch.float64) @ weight.t() + 1, self.scale * 2


def test_an_output_of_the_state_alone_is_new_at_every_call(tmp_path):
    torch.manual_seed(0)
    model = StateOutput()
    compiled = compile_with_dumps(model, tmp_path)
    x = torch.randn(3, 4)
    with torch.no_grad():
        out, doubled = call_without_fallback(compiled, x)
        doubled.add_(100.0)  # the caller owns its outputs
        expected_out, expected_doubled = model.forward(x)
        out2, doubled2 = compiled(x)
    torch.testing.assert_close(doubled2, expected_doubled)
    torch.testing.assert_close(out2, expected_out)
    state_part = frozen_source(tmp_path).split("# run at every call")[0]
    assert "aten.exp" in state_part and "aten.mul" not in state_part


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_folded_weights_are_laid_out_as_their_channels_last_inputs(tmp_path):
    torch.manual_seed(0)
    model = randomized(ConvBlock()).cuda().to(torch.bfloat16)
    compiled = compile_with_dumps(copy.deepcopy(model), tmp_path)
    x = torch.randn(4, 3, 32, 32, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x).float()
        for _ in range(3):  # compiled, recorded, replayed
            actual = call_without_fallback(compiled, x).float()
    scale = expected.abs().max()
    assert (actual - expected).abs().max() / scale < 2e-2
    state_part = frozen_source(tmp_path).split("# run at every call")[0]
    assert "memory_format = torch.channels_last" in state_part
    assert "_native_batch_norm_legit_no_training" not in frozen_source(tmp_path)


class DepthwiseThenNorm(torch.nn.Module):
    """ConvNeXt's pattern: a depthwise convolution with a bias, then a layer norm."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.conv(x).permute(0, 2, 3, 1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("grad", [False, True])
def test_on_cuda_a_convolution_bias_is_added_by_the_kernel_after_it(tmp_path, grad):
    torch.manual_seed(0)
    model = DepthwiseThenNorm().cuda()
    twin = copy.deepcopy(model)
    compiled = compile_with_dumps(twin, tmp_path)
    x = torch.randn(2, 16, 12, 12, device="cuda")
    with torch.set_grad_enabled(grad):
        expected = model(x)
        actual = call_without_fallback(compiled, x)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    if grad:
        expected.sum().backward()
        actual.sum().backward()
        torch.testing.assert_close(twin.conv.bias.grad, model.conv.bias.grad)
    (loop_ir,) = tmp_path.glob("frame*/forward_loopir.txt")
    convs = [line for line in loop_ir.read_text().splitlines() if "aten.convolution" in line]
    assert convs and all(", None, [1, 1], [3, 3]" in line for line in convs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_on_cuda_a_write_to_the_state_reaches_the_replayed_graph(tmp_path, mode):
    torch.manual_seed(0)
    model = randomized(ConvBlock()).cuda()
    compiled = kiln.compile(model, mode=mode, options={"cache": False})
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # compiled, recorded, replayed
            before = call_without_fallback(compiled, x).clone()
        model.conv.weight.mul_(-0.5)
        model.norm.running_mean.add_(1.0)
        expected = model.forward(x)
        actual = compiled(x).clone()
    assert (expected - before).abs().max() > 0.1  # the write changes the result
    # cuDNN computes float32 convolutions in TF32 by default, differently per layout
    torch.testing.assert_close(actual, expected, rtol=1e-2, atol=5e-3)


def test_a_graph_whose_frozen_values_would_take_too_much_memory_is_not_frozen(
    tmp_path, monkeypatch
):
    from kiln import freezing

    monkeypatch.setattr(freezing, "MAX_DERIVED_BYTES", 100)  # the fold takes more
    model, x = seeded_block()
    compiled = compile_with_dumps(copy.deepcopy(model), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(call_without_fallback(compiled, x), model(x))
    assert not list(tmp_path.glob("frame*/forward_frozen.py"))


def test_a_freezing_that_fails_costs_only_the_freezing(tmp_path, monkeypatch, caplog):
    from kiln import freezing

    def broken(gm, example_inputs):
        raise RuntimeError("no fold today")

    monkeypatch.setattr(freezing, "freeze", broken)
    caplog.set_level(logging.INFO, logger="kiln.fallbacks")
    model, x = seeded_block()
    compiled = compile_with_dumps(copy.deepcopy(model), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(call_without_fallback(compiled, x), model(x))
    assert "freezing failed; compiled without it" in caplog.text
    assert list(tmp_path.glob("frame*/forward_host*"))  # compiled, not run eagerly
