"""Hugging Face models built from tiny configs (random weights), in train mode, against eager.

The loss and logits, every parameter's gradient (None where eager leaves None) and every
buffer (BatchNorm running statistics) are compared, with dropout on: the compiled forward
draws the same masks as eager from the same seed.
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
DECODER = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32,
}
IMAGE = {"num_channels": 3, "num_labels": 10}

# name: (config class, model class, config, inputs: "text" or "image")
MODELS = {
    "bert": ("BertConfig", "BertForMaskedLM", SMALL, "text"),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", SMALL, "text"),
    "electra": ("ElectraConfig", "ElectraForMaskedLM", {**SMALL, "embedding_size": 16}, "text"),
    "albert": ("AlbertConfig", "AlbertForMaskedLM", {**SMALL, "embedding_size": 16}, "text"),
    "distilbert": (
        "DistilBertConfig",
        "DistilBertForMaskedLM",
        {"vocab_size": 128, "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64},
        "text",
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        {"vocab_size": 128, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32},
        "text",
    ),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        {**SMALL, "ffn_dim": 64, "word_embed_proj_dim": 32},
        "text",
    ),
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER, "text"),
    "mistral": ("MistralConfig", "MistralForCausalLM", DECODER, "text"),
    "t5": (
        "T5Config",
        "T5ForConditionalGeneration",
        {
            "vocab_size": 128,
            "d_model": 32,
            "d_kv": 16,
            "d_ff": 64,
            "num_layers": 2,
            "num_heads": 2,
            "decoder_start_token_id": 0,
        },
        "text",
    ),
    "vit": (
        "ViTConfig",
        "ViTForImageClassification",
        {
            **IMAGE,
            "image_size": 16,
            "patch_size": 4,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
        },
        "image",
    ),
    "resnet": (
        "ResNetConfig",
        "ResNetForImageClassification",
        {
            **IMAGE,
            "embedding_size": 8,
            "hidden_sizes": [8, 16],
            "depths": [1, 1],
            "layer_type": "basic",
        },
        "image",
    ),
}


class LossAndLogits(torch.nn.Module):
    """The model as a graph with a flat tuple output, as capture hands it over."""

    def __init__(self, model: torch.nn.Module, input_name: str) -> None:
        super().__init__()
        self.model = model
        self.input_name = input_name

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor):
        out = self.model(**{self.input_name: inputs}, labels=labels)
        return (out.loss, out.logits)


def build(name: str) -> tuple[torch.nn.Module, object]:
    config_cls, model_cls, config, kind = MODELS[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config))
    if kind == "text":
        module = LossAndLogits(model.train(), "input_ids")
        return module, lambda: [torch.randint(0, 128, (2, 12)), torch.randint(0, 128, (2, 12))]
    module = LossAndLogits(model.train(), "pixel_values")
    return module, lambda: [torch.randn(2, 3, 16, 16), torch.randint(0, 10, (2,))]


@pytest.mark.parametrize(
    "name", [n if n == "bert" else pytest.param(n, marks=pytest.mark.slow) for n in MODELS]
)
def test_hf_model_in_train_mode_matches_eager(name, check):
    module, inputs = build(name)
    check(module, inputs, tolerance_scale=10.0, trace=False)
