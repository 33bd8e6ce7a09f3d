"""Hand-written attention rewritten to the fused attention op (kiln/attention.py): on the
CPU with ``options={"fused_attention": True}`` (the default rewrites graphs on CUDA only;
the GPU test runs there)."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch

import kiln


def masked(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores + mask, dim=-1) @ v


def scaled(q, k, v):
    weights = torch.matmul(q, k.transpose(2, 3)) * 0.125
    return torch.matmul(weights.softmax(-1), v)


def unscaled_with_weights(q, k, v):
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return weights @ v, weights  # the weights are returned: the chain stays


def mask_after_scale_outside(q, k, v, mask):
    scores = (q @ k.transpose(-2, -1) + mask) * 0.25  # scaled after the mask: not SDPA's
    return scores.softmax(-1) @ v


def inputs(device="cpu", dtype=torch.float32, grad=False):
    q, k, v = (
        torch.randn(2, 4, 16, 32, device=device, dtype=dtype, requires_grad=grad) for _ in range(3)
    )
    return q, k, v, torch.randn(2, 1, 16, 16, device=device, dtype=dtype)


def compiled_aten(fn, args, tmp_path, **options):
    options = {"debug_dir": str(tmp_path), "cache": False, **options}
    compiled = kiln.compile(fn, options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        result = compiled(*args)
    (aten,) = tmp_path.glob("frame*/forward_aten.py")
    return result, aten.read_text()


@pytest.mark.parametrize("fn", [masked, scaled])
def test_hand_written_attention_runs_the_fused_op(fn, tmp_path):
    q, k, v, mask = inputs()
    args = (q, k, v, mask) if fn is masked else (q, k, v)
    actual, aten = compiled_aten(fn, args, tmp_path, fused_attention=True)
    torch.testing.assert_close(actual, fn(*args), rtol=1e-5, atol=1e-5)
    assert "scaled_dot_product" in aten and "aten.bmm" not in aten


def test_gradients_through_the_fused_op_equal_eager(tmp_path):
    q, k, v, mask = inputs(grad=True)
    actual, aten = compiled_aten(masked, (q, k, v, mask), tmp_path, fused_attention=True)
    grads = torch.autograd.grad(actual.square().sum(), (q, k, v))
    expected = torch.autograd.grad(masked(q, k, v, mask).square().sum(), (q, k, v))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert "scaled_dot_product" in aten


@pytest.mark.parametrize("fn", [unscaled_with_weights, mask_after_scale_outside])
def test_chains_that_are_not_attention_as_sdpa_computes_it_stay(fn, tmp_path):
    q, k, v, mask = inputs()
    args = (q, k, v) if fn is unscaled_with_weights else (q, k, v, mask)
    actual, aten = compiled_aten(fn, args, tmp_path, fused_attention=True)
    torch.testing.assert_close(actual, fn(*args), rtol=1e-5, atol=1e-5)
    assert "scaled_dot_product" not in aten


def test_by_default_graphs_on_the_cpu_keep_their_attention(tmp_path):
    q, k, v, mask = inputs()
    actual, aten = compiled_aten(masked, (q, k, v, mask), tmp_path)
    torch.testing.assert_close(actual, masked(q, k, v, mask), rtol=1e-5, atol=1e-5)
    assert "scaled_dot_product" not in aten


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_hand_written_attention_runs_a_fused_kernel(tmp_path):
    q, k, v, mask = inputs("cuda", torch.bfloat16)
    actual, aten = compiled_aten(masked, (q, k, v, mask), tmp_path)
    expected = masked(q.float(), k.float(), v.float(), mask.float())
    assert (actual.float() - expected).abs().max() < 3e-2
    assert "scaled_dot_product" in aten


def boolean_masked(q, k, v, where):
    scores = (q @ k.transpose(-2, -1) * 0.125).masked_fill(where, float("-inf"))
    return torch.nn.functional.dropout(scores.softmax(-1), p=0.1, training=False) @ v


def test_a_boolean_mask_and_dropout_outside_training_run_the_fused_op(tmp_path):
    q, k, v, _ = inputs()
    where = torch.rand(2, 1, 16, 16) > 0.7
    where[..., 0] = False  # no row fully masked
    actual, aten = compiled_aten(boolean_masked, (q, k, v, where), tmp_path, fused_attention=True)
    torch.testing.assert_close(actual, boolean_masked(q, k, v, where), rtol=1e-5, atol=1e-5)
    assert "scaled_dot_product" in aten and "aten.bmm" not in aten


def dropped_out(q, k, v):
    probs = torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1)
    return torch.nn.functional.dropout(probs, p=0.5, training=True) @ v


def test_dropout_in_training_becomes_the_fused_ops_dropout(tmp_path):
    q, k, v, _ = inputs()
    actual, aten = compiled_aten(dropped_out, (q, k, v), tmp_path, fused_attention=True)
    (rewritten,) = tmp_path.glob("frame*/captured_rewritten.py")
    assert "dropout_p = 0.5" in rewritten.read_text()
    # the random draws differ from eager's: the mean over many keys is what they share
    expected = torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1) @ v
    assert actual.shape == expected.shape and not torch.equal(actual, expected)
    assert (actual.mean() - expected.mean()).abs() < 0.1


class SelfAttention(torch.nn.Module):
    """One attention layer as BERT's and GPT-2's: a projection to heads, SDPA, a projection."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.qkv = torch.nn.Linear(256, 768)
        self.o = torch.nn.Linear(256, 256)

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 4, 64).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None if self.causal else mask, is_causal=self.causal
        )
        return self.o(out.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_on_cuda_a_training_step_runs_kilns_attention_kernels_both_ways(causal, tmp_path):
    """The forward's kernel writes the log-sum-exp the backward's kernel reads: eager's
    gradients, with no ATen attention op in either host program."""
    torch.manual_seed(0)
    model = SelfAttention(causal).cuda().to(torch.bfloat16)
    reference = SelfAttention(causal).cuda()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    for _ in range(2):
        x = torch.randn(4, 96, 256, device="cuda", dtype=torch.bfloat16)
        mask = torch.zeros(4, 1, 96, 96, device="cuda", dtype=torch.bfloat16)
        mask[:, :, :, 80:] = float("-inf")  # padded keys
        probe = torch.randn(4, 96, 256, device="cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a graph that runs eagerly warns
            (compiled(x, mask).float() * probe).sum().backward()
        (reference(x.float(), mask.float()) * probe).sum().backward()
        for p, want in zip(model.parameters(), reference.parameters(), strict=True):
            scale = want.grad.abs().max().item()
            torch.testing.assert_close(p.grad.float(), want.grad, rtol=3e-2, atol=3e-2 * scale)
            p.grad, want.grad = None, None
    sources = {h.name: h.read_text() for h in tmp_path.glob("frame*/*_host.cpp")}
    forward = next(s for name, s in sources.items() if name.startswith("forward"))
    backward = next(s for name, s in sources.items() if name.startswith("backward"))
    assert "attention_fwd (aten._scaled_dot_product" in forward, forward
    assert "attention_bwd (aten._scaled_dot_product" in backward, backward
    assert "call_extern" not in forward + backward  # no op through ATen
    # the first call ran the Python programs (the native ones built meanwhile): they launch
    # the same kernels
    programs = {h.name: h.read_text() for h in tmp_path.glob("frame*/*_host.py")}
    forward = next(s for name, s in programs.items() if name.startswith("forward"))
    backward = next(s for name, s in programs.items() if name.startswith("backward"))
    assert re.search(r"attention_fwd_\d+ = own_kernel\(", forward), forward
    assert re.search(r"attention_bwd_\d+ = own_kernel\(", backward), backward
