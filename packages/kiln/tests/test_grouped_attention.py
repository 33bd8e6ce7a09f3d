"""Attention over repeated keys and values given them before the repeat
(kiln/grouped_attention.py): the rewrite on traced graphs (on the CPU: the fused ops'
fake forms trace anywhere, and the rewritten graph runs ``kiln_loopir::grouped_attention``
through ATen), and a compiled Llama layer on CUDA against eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.grouped_attention import grouped_query_attention

F = torch.nn.functional
aten = torch.ops.aten


def repeat_kv(x, group):  # as Hugging Face's Llama repeats a key or value head
    b, heads, n, d = x.shape
    return x[:, :, None, :, :].expand(b, heads, group, n, d).reshape(b, heads * group, n, d)


def flash_causal(q, k, v):
    out = aten._scaled_dot_product_flash_attention(
        q, repeat_kv(k, 2), repeat_kv(v, 2), 0.0, True, False, scale=0.3
    )
    return out[0] * 2


def efficient_masked(q, k, v, mask):
    out = aten._scaled_dot_product_efficient_attention(
        q, repeat_kv(k, 4), repeat_kv(v, 4), mask, False
    )
    return out[0] + 1


def keys_also_returned(q, k, v):
    keys = repeat_kv(k, 2)
    out = aten._scaled_dot_product_flash_attention(q, keys, repeat_kv(v, 2), 0.0, True, False)
    return out[0], keys


def log_sum_exp_read(q, k, v, mask):
    out = aten._scaled_dot_product_efficient_attention(
        q, repeat_kv(k, 2), repeat_kv(v, 2), mask, True
    )
    return out[0], out[1]


def inputs(kv_heads=4, group=2, mask=False):
    q = torch.randn(2, kv_heads * group, 16, 32)
    k, v = torch.randn(2, kv_heads, 16, 32), torch.randn(2, kv_heads, 16, 32)
    return (q, k, v, torch.randn(2, 1, 16, 16)) if mask else (q, k, v)


def eager_attention(q, k, v, mask=None, causal=False, scale=None):
    group = q.size(1) // k.size(1)
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, group), repeat_kv(v, group), mask, is_causal=causal, scale=scale
    )


def traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def test_repeated_keys_and_values_are_read_before_the_repeat():
    q, k, v = inputs()
    rewritten = grouped_query_attention(traced(flash_causal, q, k, v))
    assert rewritten is not None
    assert "grouped_attention" in rewritten.code
    assert "clone" not in rewritten.code and "expand" not in rewritten.code
    assert "_scaled_dot_product_flash_attention" not in rewritten.code
    want = eager_attention(q, k, v, causal=True, scale=0.3) * 2
    torch.testing.assert_close(rewritten(q, k, v), want, rtol=1e-5, atol=1e-5)


def test_a_mask_and_a_larger_group_are_passed_on():
    q, k, v, mask = inputs(kv_heads=2, group=4, mask=True)
    rewritten = grouped_query_attention(traced(efficient_masked, q, k, v, mask))
    assert rewritten is not None and "grouped_attention" in rewritten.code
    want = eager_attention(q, k, v, mask) + 1
    torch.testing.assert_close(rewritten(q, k, v, mask), want, rtol=1e-5, atol=1e-5)


def test_repeats_read_elsewhere_and_read_log_sum_exps_keep_the_op():
    q, k, v = inputs()
    assert grouped_query_attention(traced(keys_also_returned, q, k, v)) is None
    q, k, v, mask = inputs(mask=True)
    assert grouped_query_attention(traced(log_sum_exp_read, q, k, v, mask)) is None


def test_keys_and_values_of_other_groups_keep_the_op():
    q, k, v = inputs(kv_heads=2, group=4)

    def mixed(q, k, v):
        keys, values = repeat_kv(k, 4), repeat_kv(torch.cat([v, v], 1), 2)
        return aten._scaled_dot_product_flash_attention(q, keys, values, 0.0, True, False)[0]

    assert grouped_query_attention(traced(mixed, q, k, v)) is None


class LlamaAttention(torch.nn.Module):
    """Grouped-query attention as Hugging Face's Llama computes it (sdpa, repeat_kv)."""

    def __init__(self, width=256, heads=8, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, width // heads
        self.q = torch.nn.Linear(width, width, bias=False)
        self.kv = torch.nn.Linear(width, 2 * kv_heads * self.d, bias=False)
        self.o = torch.nn.Linear(width, width, bias=False)

    def forward(self, x, mask):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2 * self.kv_heads, self.d).transpose(1, 2).chunk(2, 1)
        group = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(
            q, repeat_kv(k, group), repeat_kv(v, group), attn_mask=mask
        )
        return self.o(out.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_grouped_attention_runs_kiln_kernel_without_repeats(tmp_path):
    torch.manual_seed(0)
    model = LlamaAttention().cuda().to(torch.bfloat16).eval()
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    for _ in range(2):
        x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
        causal = torch.ones(64, 64, device="cuda", dtype=torch.bool).tril()
        mask = torch.where(causal, 0.0, float("-inf")).to(torch.bfloat16)[None, None]
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")  # a graph that runs eagerly warns
            got = compiled(x, mask)
            want = model(x, mask)
        scale = want.float().abs().max().item()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * scale)
    (rewritten,) = tmp_path.glob("frame*/*_aten_rewritten.py")
    assert "grouped_attention" in rewritten.read_text()
    (host,) = tmp_path.glob("frame*/*_host.cpp")
    source = host.read_text()
    assert "attention_fwd (kiln_loopir.grouped_attention" in source  # Kiln's kernel
    assert "call_extern" not in source  # no op through ATen
