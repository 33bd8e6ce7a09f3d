"""Changing sizes: ``generate()`` and a serving loop, Kiln against eager and torch.compile
in one run, on the GPU where there is one (else the CPU; ``KILN_BENCH_DEVICE`` picks).

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
- **new sizes**: the serving loop's first pass, then 20 forwards at sizes it did not run
  (of its batch sizes but 1, within its sequence lengths): the time per call of those,
  each at a size met for the first time.

``torch.compile`` runs with its defaults (``dynamic=None``), Kiln too, each with an empty cache
of its own (``KILN_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` set to new folders), so their
counts are compiles, not loads. Kiln's rows note, on the GPU, the kernels compiled at a
launch in each pass (a kernel whose sizes are arguments meeting a configuration or
specialization new to it: ``kiln_triton.launcher.compiled_at_launch``).
Run: ``python integration/bench.py generate`` (on the GPU machine, through
``integration/gpu.py`` with ``KILN_GPU_BENCH=generate``).
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from timing import background_builds_finished, markdown_table

NEW_TOKENS = 64
PROMPT = (1, 8)
SERVING_CALLS = 20
DEVICE = os.environ.get("KILN_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
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


def compiled_at_launch() -> int:
    """Kiln's kernels compiled (or read from Triton's caches) at a launch so far: a kernel
    whose sizes are arguments, at a configuration or specialization new to it."""
    launcher = sys.modules.get("kiln_triton.launcher")
    return launcher.compiled_at_launch() if launcher is not None else 0


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


def twice(build: Callable[[], torch.nn.Module], variant: str, work: Callable) -> tuple:
    """``work(model)`` run twice on a new model whose forward ``variant`` compiled:
    ``(results, seconds, graphs compiled)``, one entry per run."""
    torch.manual_seed(0)
    model = build().to(DEVICE)
    compiled_forward(model, variant)
    results, seconds, compiled, at_launch = [], [], [], []
    with torch.no_grad():
        for run in range(2):
            if run:  # the second run is a long-running job's
                background_builds_finished()
            before, launched = compiles(variant), compiled_at_launch()
            started = time.perf_counter()
            results.append(work(model))
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - started)
            compiled.append(compiles(variant) - before)
            at_launch.append(compiled_at_launch() - launched)
    return results, seconds, compiled, at_launch


def launch_note(variant: str, at_launch: list[int]) -> str:
    """Kiln's kernels compiled at a launch in each pass, where there were any."""
    if variant != "kiln" or not any(at_launch):
        return ""
    return f"; kernels compiled at launch {at_launch[0]}, {at_launch[1]}"


def row(name: str, case: str, variant: str, seconds, compiled, per: int, note: str) -> list:
    """A table row; the time per token (per call) is the second run's over ``per``."""
    return [name, case, variant, f"{compiled[0]}, {compiled[1]}", f"{seconds[0]:.2f}",
            f"{seconds[1]:.2f}", f"{seconds[1] / per * 1e3:.2f}", note]  # fmt: skip


def generate_rows(name: str, build: Callable[[], torch.nn.Module]) -> list[list[str]]:
    torch.manual_seed(0)
    prompt = torch.randint(0, 512, PROMPT).to(DEVICE)

    def generate(model):
        return model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False,
                              min_new_tokens=NEW_TOKENS, pad_token_id=0)  # fmt: skip

    rows, expected = [], None
    for variant in ("eager", "torch.compile", "kiln"):
        tokens, seconds, compiled, at_launch = twice(build, variant, generate)
        expected = tokens[0] if expected is None else expected
        same = all(torch.equal(t, expected) for t in tokens)
        note = "tokens equal eager's" if same else "TOKENS DIFFER FROM EAGER'S"
        note += launch_note(variant, at_launch)
        case = f"generate {NEW_TOKENS} tokens"
        rows.append(row(name, case, variant, seconds, compiled, NEW_TOKENS, note))
    return rows


def new_sizes(rng: random.Random, count: int, seen: list) -> list[tuple[int, int]]:
    """``count`` distinct random sizes that ``seen`` does not hold, of the batches it holds
    (but 1, which both compilers specialize) and within its sequence lengths."""
    batches = sorted({b for b, _ in seen if b > 1})
    shortest, longest = min(s for _, s in seen), max(s for _, s in seen)
    sizes: list[tuple[int, int]] = []
    while len(sizes) < count:
        size = (rng.choice(batches), rng.randint(shortest, longest))
        if size not in seen and size not in sizes:
            sizes.append(size)
    return sizes


def serving_rows(name: str, build: Callable[[], torch.nn.Module]) -> list[list[str]]:
    rng = random.Random(0)
    sizes = [(rng.randint(1, 8), rng.randint(8, 64)) for _ in range(SERVING_CALLS)]
    torch.manual_seed(0)
    passes = [[torch.randint(0, 512, size).to(DEVICE) for size in sizes]]
    rows = serving_case(name, build, f"serving loop, {SERVING_CALLS} sizes", passes * 2)
    new = new_sizes(rng, SERVING_CALLS, sizes)
    passes.append([torch.randint(0, 512, size).to(DEVICE) for size in new])
    return rows + serving_case(name, build, f"{SERVING_CALLS} new sizes", passes)


def serving_case(name: str, build, case: str, passes: list[list[torch.Tensor]]) -> list:
    """Rows of the forwards over ``passes`` (two lists of token ids) for every variant."""
    done = []

    def serve(model):
        batches = passes[len(done) % 2]
        done.append(True)
        return [model(ids, use_cache=False).logits for ids in batches]

    rows, expected = [], None
    for variant in ("eager", "torch.compile", "kiln"):
        outputs, seconds, compiled, at_launch = twice(build, variant, serve)
        expected = outputs if expected is None else expected  # eager's, pass by pass
        ok = all(
            torch.allclose(a, b, rtol=1e-3, atol=1e-3)
            for out, want in zip(outputs, expected, strict=True)
            for a, b in zip(out, want, strict=True)
        )
        note = "outputs equal eager's" if ok else "OUTPUTS DIFFER FROM EAGER'S"
        note += launch_note(variant, at_launch)
        rows.append(row(name, case, variant, seconds, compiled, SERVING_CALLS, note))
    return rows


def where() -> str:
    if DEVICE == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU, {torch.get_num_threads()} thread(s)"


def main() -> str:
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-bench-generate-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-bench-generate-")
    count_lowerings()
    rows = []
    for name, build in (("GPT-2 2 layers", gpt2), ("Llama 2 layers", llama)):
        try:
            rows += generate_rows(name, build)
            rows += serving_rows(name, build)
        except ImportError as exc:
            print(f"bench_generate: {name} left out: {exc}", file=sys.stderr)
    intro = (
        f"torch {torch.__version__}, {where()}; graphs compiled in "
        "the first and the second pass; time per token of the second generate, per call of "
        "the second serving pass (new sizes: of the pass at sizes the first did not run)"
    )
    return f"{intro}\n\n{markdown_table(HEADER, rows, numeric=0)}"


if __name__ == "__main__":
    print(main())
