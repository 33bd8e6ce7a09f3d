"""Capture time of a 12-layer Hugging Face model (hidden 64, 2x16 tokens) in this process.

    python bench_capture.py bert|gpt2|bert-train            # kiln_capture alone
    KILN_CACHE_DIR=/tmp/kc python bench_capture.py bert --kiln   # kiln.compile; run it
                                                             # twice: cold, then warm

Alone, the first capture of the model is timed after a small model's capture has warmed
the imports (backend: the graph's own ``forward``), so each run is one fresh process. With
``--kiln``, the figure is ``kiln.compile_times()["capture"]`` of the first call (capture,
guards, code and the first run; the backend's stages are timed apart). ``bert-train`` is
the model in train mode (dropout 0) called with grad enabled. One thread: the figures are
steadier on a shared machine.
"""

from __future__ import annotations

import sys
import time

import torch
import transformers

import kiln_capture


def model(name: str) -> torch.nn.Module:
    if name.startswith("bert"):
        config = transformers.BertConfig(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=12,
            num_attention_heads=4,
            intermediate_size=128,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return transformers.BertModel(config).train(name == "bert-train")
    config = transformers.GPT2Config(n_layer=12, n_embd=64, n_head=4, vocab_size=512)
    return transformers.GPT2Model(config).eval()


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "bert"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    module, ids = model(name), torch.randint(0, 512, (2, 16))
    grad = name == "bert-train"
    if "--kiln" in sys.argv:
        import kiln

        compiled = kiln.compile(module)
        with torch.set_grad_enabled(grad):
            compiled(input_ids=ids)
        print(f"{name}: capture {kiln.compile_times()['capture']:.3f} s (kiln, first call)")
        return

    def backend(gm, example_inputs):
        return gm.forward

    warm_up = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    kiln_capture.capture(warm_up, backend)(torch.randn(2, 4))
    captured = kiln_capture.capture(module, backend)
    started = time.perf_counter()
    with torch.set_grad_enabled(grad):
        captured(input_ids=ids)
    print(f"{name}: capture {time.perf_counter() - started:.3f} s (kiln_capture alone)")


if __name__ == "__main__":
    main()
