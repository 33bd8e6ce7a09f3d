"""Hugging Face models built from tiny configs (random weights), in train mode, against eager.

The loss and logits, every parameter's gradient (None where eager leaves None) and every
buffer are compared, with dropout on: the compiled forward draws the same masks as eager
from the same seed.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 40,
}

MODELS = {
    "bert": ("BertConfig", "BertForMaskedLM", SMALL),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", SMALL),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", {**SMALL, "embedding_size": 16}),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        {"vocab_size": 128, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32},
    ),
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {**SMALL, "num_key_value_heads": 1, "max_position_embeddings": 32},
    ),
}


class LossAndLogits(torch.nn.Module):
    """The model as a graph with a flat tuple output, as capture hands it over."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        out = self.model(input_ids=input_ids, labels=labels)
        return (out.loss, out.logits)


def build(name: str) -> torch.nn.Module:
    config_cls, model_cls, config = MODELS[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_cls)(**config)
    return LossAndLogits(getattr(transformers, model_cls)(cfg).train())


def tokens() -> list[torch.Tensor]:
    return [torch.randint(0, 128, (2, 12)), torch.randint(0, 128, (2, 12))]


@pytest.mark.parametrize(
    "name",
    [
        "bert",
        pytest.param("roberta", marks=pytest.mark.slow),
        pytest.param("electra", marks=pytest.mark.slow),
        pytest.param("gpt2", marks=pytest.mark.slow),
        pytest.param("llama", marks=pytest.mark.slow),
    ],
)
def test_hf_model_in_train_mode_matches_eager(name, check):
    check(build(name), tokens, tolerance_scale=10.0, trace=False)
