"""Changing sizes on the CPU: ``generate()`` and a serving loop, Kiln against eager and
torch.compile in one run.

Models (random weights from configs, nothing downloaded): a Hugging Face GPT-2 and a Llama,
each 2 layers of hidden 64, vocab 512, with their key/value cache.

- **generate**: ``model.generate`` of 64 new tokens (greedy) from a 1x8 prompt, with the
  model's ``forward`` compiled (``model.forward = compile(model.forward)``), twice. Reported:
  graphs compiled during the first and the second call (Kiln: lowerings by kiln-loopir;
  torch.compile: dynamo's unique graphs), the time of each call, and the time per token of
  the second. The tokens must equal eager's.
- **serving loop**: 20 forwards on random (batch 1-8, sequence 8-64) token ids, without the
  cache, twice over the same sizes: graphs compiled in each pass and the time per call of
  the second. Outputs checked against eager.

``torch.compile`` runs with its defaults (``dynamic=None``), Kiln too, with an empty cache of
its own (``KILN_CACHE_DIR`` set to a new folder), so its counts are compiles, not loads.
Run: ``python integration/bench.py generate``.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from timing import markdown_table

NEW_TOKENS = 64
PROMPT = (1, 8)
SERVING_CALLS = 20
HEADER = ["model", "case", "variant", "graphs compiled (1st, 2nd)", "1st s", "2nd s",
          "per token / call ms", "note"]  # fmt: skip


def gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=256)
    return GPT2LMHeadModel(config).eval()


def llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                         max_position_embeddings=256)  # fmt: skip
    return LlamaForCausalLM(config).eval()


_LOWERINGS = [0]  # kiln-loopir's compiles of an aten graph, once counting is installed


def count_lowerings() -> None:
    """Count Kiln's compiles of an aten graph from now on (installed once)."""
    import kiln.pipeline

    real = kiln.pipeline.kiln_loopir.compile_fx
    if getattr(real, "counting", False):
        return

    def counting(*args, **kwargs):
        _LOWERINGS[0] += 1
        return real(*args, **kwargs)

    counting.counting = True
    kiln.pipeline.kiln_loopir.compile_fx = counting


def compiles(variant: str) -> int:
    """Graphs compiled so far by ``variant`` (Kiln: lowerings; torch.compile: unique graphs)."""
    if variant == "kiln":
        return _LOWERINGS[0]
    if variant == "torch.compile":
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"]
    return 0


def compiled_forward(model: torch.nn.Module, variant: str) -> None:
    """``model.forward`` compiled by ``variant`` (eager: left as it is)."""
    if variant == "torch.compile":
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward)
    elif variant == "kiln":
        import kiln

        kiln.reset()
        model.forward = kiln.compile(model.forward)


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def generate_rows(name: str, build: Callable[[], torch.nn.Module]) -> list[list[str]]:
    torch.manual_seed(0)
    prompt = torch.randint(0, 512, PROMPT)
    rows, expected = [], None
    for variant in ("eager", "torch.compile", "kiln"):
        torch.manual_seed(0)
        model = build()
        compiled_forward(model, variant)

        def run(model=model):
            return model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  min_new_tokens=NEW_TOKENS, pad_token_id=0)  # fmt: skip

        with torch.no_grad():
            before = compiles(variant)
            first, first_s = timed(run)
            middle = compiles(variant)
            second, second_s = timed(run)
            after = compiles(variant)
        if expected is None:
            expected = first
        same = torch.equal(first, expected) and torch.equal(second, expected)
        note = "tokens equal eager's" if same else "TOKENS DIFFER FROM EAGER'S"
        rows.append([name, f"generate {NEW_TOKENS} tokens", variant,
                     f"{middle - before}, {after - middle}", f"{first_s:.2f}",
                     f"{second_s:.2f}", f"{second_s / NEW_TOKENS * 1e3:.2f}", note])  # fmt: skip
    return rows


def serving_rows(name: str, build: Callable[[], torch.nn.Module]) -> list[list[str]]:
    rng = random.Random(0)
    sizes = [(rng.randint(1, 8), rng.randint(8, 64)) for _ in range(SERVING_CALLS)]
    torch.manual_seed(0)
    batches = [torch.randint(0, 512, size) for size in sizes]
    rows, expected = [], None
    for variant in ("eager", "torch.compile", "kiln"):
        torch.manual_seed(0)
        model = build()
        compiled_forward(model, variant)

        def serve(model=model):
            return [model(ids, use_cache=False).logits for ids in batches]

        with torch.no_grad():
            before = compiles(variant)
            first, first_s = timed(serve)
            middle = compiles(variant)
            second, second_s = timed(serve)
            after = compiles(variant)
        if expected is None:
            expected = first
        ok = all(
            torch.allclose(a, b, rtol=1e-4, atol=1e-4)
            for out in (first, second)
            for a, b in zip(out, expected, strict=True)
        )
        rows.append([name, f"serving loop, {SERVING_CALLS} sizes", variant,
                     f"{middle - before}, {after - middle}", f"{first_s:.2f}",
                     f"{second_s:.2f}", f"{second_s / SERVING_CALLS * 1e3:.2f}",
                     "outputs equal eager's" if ok else "OUTPUTS DIFFER FROM EAGER'S"])  # fmt: skip
    return rows


def main() -> str:
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-bench-generate-")
    count_lowerings()
    rows = []
    for name, build in (("GPT-2 2 layers", gpt2), ("Llama 2 layers", llama)):
        try:
            rows += generate_rows(name, build)
            rows += serving_rows(name, build)
        except ImportError as exc:
            print(f"bench_generate: {name} left out: {exc}", file=sys.stderr)
    intro = (
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); graphs compiled in "
        "the first and the second pass; time per token of the second generate, per call of "
        "the second serving pass"
    )
    return f"{intro}\n\n{markdown_table(HEADER, rows, numeric=0)}"


if __name__ == "__main__":
    print(main())
