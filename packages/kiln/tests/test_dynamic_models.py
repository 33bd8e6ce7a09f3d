"""Dynamic shapes end to end on Hugging Face GPT-2 (2 layers, random weights) and with the
user's marks: one lowering per size family, no graph break, every call equal to eager, no
warning (a graph that ran eagerly instead would warn; warnings are errors here)."""

from __future__ import annotations

import logging

import pytest
import torch

import kiln
import kiln.pipeline

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("own_cache", "warnings_are_errors")


def gpt2(use_cache: bool):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=2,
        vocab_size=100,
        n_positions=128,
        use_cache=use_cache,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def test_gpt2_over_growing_lengths_lowers_once_per_size_family(lowerings):
    model = gpt2(use_cache=False)
    compiled = kiln.compile(model)
    with torch.no_grad():
        for length in range(5, 15):
            input_ids = torch.randint(0, 100, (2, length))
            torch.testing.assert_close(compiled(input_ids).logits, model(input_ids).logits)
    assert lowerings == [False, True]  # the first length, then every length


def test_gpt2_generate_with_a_kv_cache_lowers_three_graphs_once(lowerings):
    model = gpt2(use_cache=True)
    input_ids = torch.randint(0, 100, (1, 6))
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    expected = model.generate(input_ids, **settings)
    model.forward = kiln.compile(model.forward)
    assert torch.equal(model.generate(input_ids, **settings), expected)
    # the prompt, the first token (a cache of the prompt's length, an input of length 1:
    # a size of 1 is never symbolic) and every token after it (every cache tensor's
    # length symbolic at once)
    assert lowerings == [False, False, True]
    assert torch.equal(model.generate(input_ids, **settings), expected)
    assert len(lowerings) == 3, "a second generate lowers nothing"


def test_the_recompile_log_shows_every_failed_guard_old_and_new(lowerings, caplog):
    def attend(q, keys, values):
        return (q @ keys.transpose(-1, -2)).softmax(-1) @ values

    compiled = kiln.compile(attend)
    kiln.set_logs("recompiles")
    logger = logging.getLogger("kiln.recompiles")
    logger.addHandler(caplog.handler)
    try:
        for n in (3, 4, 5):
            q, k, v = torch.randn(2, 1, 8), torch.randn(2, n, 8), torch.randn(2, n, 8)
            torch.testing.assert_close(compiled(q, k, v), attend(q, k, v))
    finally:
        logger.removeHandler(caplog.handler)
        kiln.set_logs("")
    (message,) = [r.getMessage() for r in caplog.records if "recompiled" in r.getMessage()]
    assert "2 guard(s) failed" in message
    assert "guard failed: keys: Tensor(float32, cpu, size=(2, 3, 8)" in message
    assert "now Tensor(float32, cpu, size=(2, 4, 8)" in message
    assert "now symbolic: keys.size(1), values.size(1)" in message
    assert lowerings == [False, True]


def test_mark_dynamic_lowers_the_family_on_the_first_call(lowerings):
    def fn(x):
        return (x * 2).softmax(-1)

    compiled = kiln.compile(fn)
    for n in (4, 6, 9):
        x = kiln.mark_dynamic(torch.randn(n, 16), 0, min=2, max=64)
        torch.testing.assert_close(compiled(x), fn(x))
    assert lowerings == [True]


def test_mark_static_keeps_a_size_static_under_dynamic_true(lowerings):
    def fn(x):
        return x.cos().sum(0)

    compiled = kiln.compile(fn, dynamic=True)
    for n in (4, 6):
        x = kiln.mark_static(torch.randn(n, 8))
        torch.testing.assert_close(compiled(x), fn(x))
    assert lowerings == [False, False]


def test_a_function_that_runs_eagerly_says_so_once():
    def fn(x):  # a generator function: capture runs it eagerly
        yield (x + 1) * x.sin()

    compiled = kiln.compile(fn)
    x = torch.randn(4)
    with pytest.warns(RuntimeWarning, match="eagerly: generators and coroutines run eagerly"):
        torch.testing.assert_close(list(compiled(x)), list(fn(x)))
    torch.testing.assert_close(list(compiled(x)), list(fn(x)))  # said once: no warning now
