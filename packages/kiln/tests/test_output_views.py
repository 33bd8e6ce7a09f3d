"""An output that eager gives as a tensor of its own is no view under Kiln either, even
where the host program laid it out in memory it shares with other values: it can be
written in place before the backward, as eager's can."""

from __future__ import annotations

import copy

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


def first(out):
    return out[0] if isinstance(out, tuple) else out


def test_a_gpt2_blocks_output_is_no_view_and_takes_an_in_place_write():
    config = transformers.GPT2Config(
        n_layer=1, n_embd=64, n_head=4, vocab_size=128, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    block = transformers.GPT2LMHeadModel(config).transformer.h[0]
    twin = copy.deepcopy(block)
    compiled = kiln.compile(twin)
    x = torch.randn(2, 16, 64, requires_grad=True)
    expected = first(block(x))
    actual = first(compiled(x))
    assert kiln.compile_times().get("lowering", 0.0) > 0, "no graph was lowered"
    assert actual._base is None and expected._base is None
    for out in (expected, actual):
        out += 1  # raised under Kiln: a view made inside an autograd.Function
        out.square().sum().backward()
    for (name, p), q in zip(block.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_a_view_of_an_intermediate_nothing_else_reads_takes_an_in_place_write():
    """GPT-2's logits: the graph's linear layer ends in a view of its matrix product, which
    nothing else reads; eager's ``_unsafe_view`` makes it a tensor of its own."""
    config = transformers.GPT2Config(
        n_layer=1, n_embd=64, n_head=4, vocab_size=128, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    model = transformers.GPT2LMHeadModel(config)
    twin = copy.deepcopy(model)
    compiled = kiln.compile(twin)
    ids = torch.randint(0, 128, (2, 16))
    expected, actual = model(input_ids=ids).logits, compiled(input_ids=ids).logits
    assert actual._base is None and expected._base is None
    for logits in (expected, actual):
        logits += 1
        logits.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
