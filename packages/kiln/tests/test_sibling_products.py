"""Products of one input by several frozen weights merged into one (kiln/sibling_products.py):
the rewrite on traced graphs (on the CPU, with the device's timing taken as "faster"), and
a compiled attention block on CUDA against eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import sibling_products
from kiln.sibling_products import merged_products
from kiln_autograd.static_inputs import UNWRITTEN_STATE

F = torch.nn.functional
aten = torch.ops.aten


@pytest.fixture
def always_faster(monkeypatch):
    monkeypatch.setattr(sibling_products, "_faster", lambda *shape: True)


def projections(x, wq, wk, wv):  # as F.linear views a 3-D input anew for each product
    q, k, v = (F.linear(x, w) for w in (wq, wk, wv))
    return q.view(*x.shape[:2], 4, -1).transpose(1, 2) * 2, k.relu(), v + 1


def biased(x, wa, ba, wb, bb):
    return F.linear(x, wa, ba).sigmoid() * F.linear(x, wb, bb)


def traced(fn, args, state):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    gm.meta[UNWRITTEN_STATE] = state
    return gm


def aten_calls(gm, op):
    return [n for n in gm.graph.nodes if n.target is op]


def test_products_of_one_input_are_one_product_sliced(always_faster):
    args = (torch.randn(2, 6, 32), torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32))
    gm = traced(projections, args, (1, 2, 3))
    merged = merged_products(gm, "cpu")
    assert merged is not None
    assert len(aten_calls(merged, aten.mm.default)) == 1
    assert len(aten_calls(merged, aten.slice.Tensor)) == 3
    (product,) = aten_calls(merged, aten.mm.default)
    assert tuple(product.meta["val"].shape) == (12, 64)
    for got, want in zip(merged(*args), projections(*args), strict=True):
        torch.testing.assert_close(got, want)
    # the readers' values have the parts' layout: rows of the merged product
    (view,) = [n for n in merged.graph.nodes if n.args[1:] == ([2, 6, 32],)]
    assert view.meta["val"].stride() == (6 * 64, 64, 1)


def test_products_the_graph_returns_keep_their_own_layout(always_faster):
    def returned(x, wa, wb, wc):
        return F.linear(x, wa), F.linear(x, wb) * 2, F.linear(x, wc) + 1

    args = (torch.randn(2, 6, 32), torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32))
    merged = merged_products(traced(returned, args, (1, 2, 3)), "cpu")
    assert merged is not None and len(aten_calls(merged, aten.mm.default)) == 2  # b and c
    for got, want in zip(merged(*args), returned(*args), strict=True):
        torch.testing.assert_close(got, want)
    (output,) = merged.graph.find_nodes(op="output")  # the compiled code's layouts
    assert [n.meta["val"].stride() for n in output.args[0]] == [t.stride() for t in returned(*args)]


def test_biases_are_concatenated_with_their_weights(always_faster):
    args = (torch.randn(3, 5, 24), torch.randn(8, 24), torch.randn(8), torch.randn(8, 24),
            torch.randn(8))  # fmt: skip
    merged = merged_products(traced(biased, args, (1, 2, 3, 4)), "cpu")
    assert merged is not None and len(aten_calls(merged, aten.addmm.default)) == 1
    torch.testing.assert_close(merged(*args), biased(*args))


def test_weights_that_are_not_frozen_state_or_slower_merged_stay(always_faster, monkeypatch):
    args = (torch.randn(2, 6, 32), torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32))
    assert merged_products(traced(projections, args, ()), "cpu") is None  # a training graph
    one_product = merged_products(traced(projections, args, (1, 2)), "cpu")  # wv not state
    assert one_product is not None and len(aten_calls(one_product, aten.mm.default)) == 2
    monkeypatch.setattr(sibling_products, "_faster", lambda *shape: False)
    assert merged_products(traced(projections, args, (1, 2, 3)), "cpu") is None


class Attention(torch.nn.Module):
    def __init__(self, width=1024, kv_width=512):
        super().__init__()
        self.q = torch.nn.Linear(width, width, bias=False)
        self.k = torch.nn.Linear(width, kv_width, bias=False)
        self.v = torch.nn.Linear(width, kv_width, bias=False)

    def forward(self, x):
        q = self.q(x).view(*x.shape[:2], 16, 64).transpose(1, 2)
        k = self.k(x).view(*x.shape[:2], 8, 64).transpose(1, 2)
        v = self.v(x).view(*x.shape[:2], 8, 64).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(*x.shape)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_projections_of_frozen_weights_are_one_product(tmp_path):
    torch.manual_seed(0)
    model = Attention().cuda().to(torch.bfloat16).eval().requires_grad_(False)
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    for _ in range(2):
        x = torch.randn(8, 128, 1024, device="cuda", dtype=torch.bfloat16)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a graph that runs eagerly warns
            got = compiled(x)
        want = model(x)
        scale = want.float().abs().max().item()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * scale)
    (frozen,) = tmp_path.glob("frame*/*_frozen.py")
    text = frozen.read_text()
    assert "aten.cat" in text and text.count("aten.mm") == 1, text
