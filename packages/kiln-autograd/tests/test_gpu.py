"""The same checks on a CUDA device (run through integration/gpu.py on a GPU machine)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x):
        h = self.drop(F.gelu(self.bn(self.fc(x))))
        return (h.softmax(-1), h.sum())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_on_cuda_matches_eager(dtype, check):
    torch.manual_seed(0)
    module = Block().train().to("cuda", dtype)

    def inputs():
        return [torch.randn(16, 32, device="cuda", dtype=dtype, requires_grad=True)]

    # Eager runs cuDNN's batch norm, the graph the functional one: bfloat16 rounds apart
    # (gradients are compared normwise, see conftest.close).
    check(module, inputs, tolerance_scale=2.0 if dtype == torch.bfloat16 else 1.0)


@pytest.mark.gpu
def test_attention_on_cuda_matches_eager(check):
    def attention(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True),)

    def inputs():
        return [
            torch.randn(2, 4, 16, 32, device="cuda", dtype=torch.float16, requires_grad=True)
            for _ in range(3)
        ]

    check(attention, inputs, tolerance_scale=4.0)


class Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask),)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", [None, "float", "bool"])
def test_attention_graph_holds_the_fused_kernel_eager_runs(mask):
    """Traced on fake tensors, attention keeps the fused kernel eager picks (not two
    matmuls and a softmax), and the graph computes what eager does."""
    import kiln_autograd

    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    m = None
    if mask == "float":
        m = torch.randn(2, 1, 128, 128, device="cuda", dtype=torch.bfloat16)
    elif mask == "bool":
        m = torch.rand(2, 1, 128, 128, device="cuda") > 0.3
    graph = kiln_autograd.trace_inference_graph(Attention(), [q, k, v, m])
    targets = {str(n.target) for n in graph.gm.graph.nodes}
    assert any(t.startswith("aten._scaled_dot_product_") for t in targets), targets
    assert "aten.bmm.default" not in targets
    (got,) = graph.gm(q, k, v, m)[:1]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_attention_under_autocast_casts_its_inputs_as_eager():
    """The fused op runs on autocast's casts, as eager's call does: bfloat16 output, and
    a float32 mask cast with the rest (the fused op rejects a mask of another dtype)."""
    import kiln_autograd

    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda") for _ in range(3))
    m = torch.randn(2, 1, 128, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        graph = kiln_autograd.trace_inference_graph(Attention(), [q, k, v, m])
        (got,) = graph.gm(q, k, v, m)[:1]
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    targets = {str(n.target) for n in graph.gm.graph.nodes}
    assert any(t.startswith("aten._scaled_dot_product_") for t in targets), targets
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
