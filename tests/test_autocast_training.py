"""A training step under ``torch.autocast`` (bfloat16) through kiln.compile gives eager's
loss and gradients: small Hugging Face Llama and GPT-2 models, on the CPU and (GPU entry
point) on CUDA, where autocast casts other ops than on the CPU. GPT-2's forward breaks
inside the caller's autocast region (``loss_function`` logs once): the frame resumes
after the break, compiled, with no "runs eagerly" warning."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(config)


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=512, n_embd=128, n_layer=2, n_head=4, n_positions=256,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def loss_and_grads(model, fn, ids, device):
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = fn(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("make", [llama, gpt2])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_training_step_under_autocast_gives_eagers_gradients(device, make, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln-cache"))
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cpp-cache"))
    model = make().to(device)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 512, (2, 64), device=device)
    expected_loss, expected = loss_and_grads(model, model, ids, device)
    lowered = kiln.compile_times().get("lowering", 0.0)
    compiled = kiln.compile(twin)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual_loss, actual = loss_and_grads(twin, compiled, ids, device)
    eager_runs = [str(w.message) for w in caught if "eagerly" in str(w.message)]
    assert not eager_runs, eager_runs
    assert kiln.compile_times().get("lowering", 0.0) > lowered, "no graph was lowered"
    torch.testing.assert_close(actual_loss, expected_loss, rtol=1e-2, atol=1e-2)
    for (name, _), got, want in zip(model.named_parameters(), actual, expected, strict=True):
        # bfloat16 products: the gradient as a whole within 2 % of eager's
        error = (got.float() - want.float()).norm() / want.float().norm()
        assert error < 2e-2, f"{name}: gradient off by {error:.3f} of its norm"
