"""The models of the GPU call benchmark, at a serving size and a throughput size.

Hugging Face models are built from configs with random weights (nothing is downloaded) and
return their last hidden state; timm models are ``timm.create_model(pretrained=False)``.
Dropout is off everywhere, so a training step can be checked against eager's. A builder
raises ImportError when its library is missing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# (batch, tokens) for text, batch for 224x224 images
SIZES = {
    "serving": {"text": (8, 128), "image": 8},
    "throughput": {"text": (32, 512), "image": 64},
}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


class LastHidden(torch.nn.Module):
    """A Hugging Face model as a function of token ids returning one tensor."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids).last_hidden_state


def bert() -> tuple[torch.nn.Module, int]:
    from transformers import BertConfig, BertModel

    return LastHidden(BertModel(BertConfig(**NO_DROPOUT))), 30522  # bert-base


def gpt2() -> tuple[torch.nn.Module, int]:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return LastHidden(GPT2Model(config)), config.vocab_size


def llama() -> tuple[torch.nn.Module, int]:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                         max_position_embeddings=1024, use_cache=False)  # fmt: skip
    return LastHidden(LlamaModel(config)), config.vocab_size


def timm_model(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import timm

        return timm.create_model(name, pretrained=False)

    return build


TEXT = {"bert": bert, "gpt2": gpt2, "llama": llama}
IMAGE = {
    "resnet50": timm_model("resnet50"),
    "vit_base_patch16_224": timm_model("vit_base_patch16_224"),
    "convnext_tiny": timm_model("convnext_tiny"),
    "mobilenetv3_large_100": timm_model("mobilenetv3_large_100"),
}
NAMES = [*TEXT, *IMAGE]


def build(name: str, size: str, device: str = "cuda", dtype=torch.bfloat16):
    """(model in ``dtype`` on ``device``, inputs) of model ``name`` at ``size``."""
    torch.manual_seed(0)
    if name in TEXT:
        model, vocab = TEXT[name]()
        batch, tokens = SIZES[size]["text"]
        inputs = [torch.randint(0, vocab, (batch, tokens), device=device)]
    else:
        model = IMAGE[name]()
        batch = SIZES[size]["image"]
        inputs = [torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)]
    return model.to(device, dtype), inputs


def describe_inputs(inputs: list[torch.Tensor]) -> str:
    return "x".join(str(d) for d in inputs[0].shape)
