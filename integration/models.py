"""Hugging Face models with random weights, built from small configs (nothing is downloaded)."""

from __future__ import annotations

import torch


def tiny_bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    model = BertModel(config).eval()
    inputs = {"input_ids": torch.randint(0, config.vocab_size, (2, 16))}
    return model, inputs
