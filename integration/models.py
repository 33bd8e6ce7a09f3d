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


def demo_bert(batch: int = 8, length: int = 64):
    """BERT for masked language modelling, 2 layers, hidden 64, no dropout (so that a
    training step can be compared with eager's), and a batch of token ids and labels."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForMaskedLM(config)
    inputs = {
        "input_ids": torch.randint(0, config.vocab_size, (batch, length)),
        "labels": torch.randint(0, config.vocab_size, (batch, length)),
    }
    return model, inputs


# --- the integration suite's models: name -> builder of (model, make_inputs), each small
# and randomly initialised. Dropout is off: Kiln's generated kernels draw random numbers
# from their own generator, so a training step equals eager's only without dropout.

TEXT = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 40,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


def _text_inputs(vocab_size: int = 128, batch: int = 2, length: int = 12):
    def make() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab_size, (batch, length))
        return {"input_ids": ids, "labels": torch.randint(0, vocab_size, (batch, length))}

    return make


def bert_mlm():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(**TEXT)), _text_inputs()


def gpt2_lm():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config), _text_inputs()


def llama_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config), _text_inputs()


def t5_seq2seq():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=128,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        dropout_rate=0.0,
    )
    return T5ForConditionalGeneration(config), _text_inputs()


def vit_classifier():
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        num_channels=3,
        num_labels=10,
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )

    def make() -> dict[str, torch.Tensor]:
        return {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.randint(0, 10, (2,))}

    return ViTForImageClassification(config), make


SUITE = {
    "bert": bert_mlm,
    "gpt2": gpt2_lm,
    "llama": llama_lm,
    "t5": t5_seq2seq,
    "vit": vit_classifier,
}
