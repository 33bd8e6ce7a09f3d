"""kiln-cpp against eager and torch.compile's CPU backend (inductor), in one run.

Micro cases are traced to aten graphs with ``kiln_loopir.testing.trace_aten``; the Hugging
Face models (small configs, random weights, inference) with
``kiln_autograd.trace_inference_graph``, whose graph takes the parameters first. Both are
compiled with ``kiln_loopir.compile_fx(..., codegen="cpp")``. Every variant runs with the
same ``torch.set_num_threads``, is warmed up, and is timed as the median of several
repeats; the variants take turns within each repeat so a busy machine slows them alike.
The last row is the geometric mean of the speedups.

Run: ``cd integration && python bench.py cpp`` (or ``python benchmarks/bench_cpp.py``).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import kiln_autograd
import kiln_loopir
from kiln_loopir.testing import trace_aten

# one thread by default: on a small machine shared with other work, OpenMP threads that
# wait for a busy core distort every variant
THREADS = int(os.environ.get("KILN_BENCH_THREADS", "1"))
REPEATS = 15
TARGET_S = 0.02  # each timing calls the function for about this long


def _micro_cases() -> dict[str, tuple[Callable, list[torch.Tensor]]]:
    n = 1024
    x, y = torch.randn(n, n), torch.randn(n, n)
    w, b = torch.randn(n), torch.randn(n)
    index = torch.randint(0, n, (n, 256))
    return {
        "pointwise chain (a*b+1).relu().sigmoid()": (
            lambda a, c: torch.sigmoid(torch.relu(a * c + 1)) * a,
            [x, y],
        ),
        "softmax rows": (lambda a: torch.softmax(a, -1), [x]),
        "layernorm + gelu": (lambda a, w, b: F.gelu(F.layer_norm(a, (n,), w, b)), [x, w, b]),
        "row sum": (lambda a: a.sum(-1), [x]),
        "column sum": (lambda a: a.sum(0), [x]),
        "var_mean rows": (lambda a: torch.var_mean(a, -1), [x]),
        "transpose + add": (lambda a, c: a.t() + c, [x, y]),
        "gather rows": (lambda a, i: torch.gather(a, 1, i) * 2, [x, index]),
    }


class _Logits(torch.nn.Module):
    """A Hugging Face model as a function of its token ids returning one tensor."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _models() -> dict[str, tuple[torch.nn.Module, list[torch.Tensor]]]:
    import transformers

    common = {"vocab_size": 1000, "num_hidden_layers": 2, "num_attention_heads": 4}
    configs = {
        "BERT (2 layers, hidden 256, seq 128)": transformers.BertModel(
            transformers.BertConfig(
                **common, hidden_size=256, intermediate_size=1024, max_position_embeddings=128
            )
        ),
        "GPT-2 (2 layers, hidden 256, seq 128)": transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=1000,
                n_embd=256,
                n_layer=2,
                n_head=4,
                n_positions=128,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        "Llama (2 layers, hidden 256, seq 128)": transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                **common,
                hidden_size=256,
                intermediate_size=688,
                num_key_value_heads=2,
                max_position_embeddings=128,
            )
        ),
    }
    ids = torch.randint(0, 1000, (2, 128))
    return {name: (_Logits(m.eval()), [ids]) for name, m in configs.items()}


def _kiln_micro(fn: Callable, inputs: list[torch.Tensor]) -> Callable:
    return kiln_loopir.compile_fx(trace_aten(fn, inputs), inputs, codegen="cpp")


def _constants_as_inputs(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """Turn the graph's tensor constants (``get_attr``) into trailing inputs and return
    their values: kiln-loopir's decomposition step cannot retrace a graph holding them
    (GPT-2's and Llama's graphs carry empty constants)."""
    constants = []
    last = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        with gm.graph.inserting_after(last):
            last = gm.graph.placeholder(f"constant{len(constants)}")
        last.meta = dict(node.meta)
        node.replace_all_uses_with(last)
        constants.append(getattr(gm, node.target))
        gm.graph.erase_node(node)
    gm.recompile()
    return constants


def _kiln_model(module: torch.nn.Module, inputs: list[torch.Tensor]) -> Callable:
    """The model through kiln-autograd's inference path (parameters lifted to inputs)."""

    def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        constants = _constants_as_inputs(gm)
        compiled = kiln_loopir.compile_fx(gm, [*example_inputs, *constants], codegen="cpp")
        return lambda *args: compiled(*args, *constants)

    with torch.no_grad():
        return kiln_autograd.aot(module, inputs, compiler)


def _first(out: object) -> torch.Tensor:
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out  # type: ignore[return-value]


def _calls_per_timing(fn: Callable, inputs: list) -> int:
    start = time.perf_counter()
    fn(*inputs)
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(200, int(TARGET_S / once)))


def _time(variants: dict[str, Callable], inputs: list) -> dict[str, float]:
    """Median ms per call of each variant; the variants take turns in every repeat."""
    calls = {name: _calls_per_timing(fn, inputs) for name, fn in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    gc.disable()
    try:
        for _ in range(REPEATS):
            for name, fn in variants.items():
                start = time.perf_counter()
                for _ in range(calls[name]):
                    fn(*inputs)
                samples[name].append((time.perf_counter() - start) / calls[name] * 1e3)
    finally:
        gc.enable()
    return {name: statistics.median(s) for name, s in samples.items()}


def _measure(fn: Callable, kiln: Callable, inputs: list) -> dict[str, float]:
    torch._dynamo.reset()
    inductor = torch.compile(fn, backend="inductor")
    expected = _first(fn(*inputs))
    for variant in (inductor, kiln):
        for _ in range(3):  # warm-up: compile, first-touch of the outputs
            got = _first(variant(*inputs))
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    return _time({"eager": fn, "torch.compile": inductor, "kiln": kiln}, inputs)


def measure() -> list[tuple[str, dict[str, float]]]:
    torch.set_num_threads(THREADS)
    rows = []
    with torch.no_grad():
        for name, (fn, inputs) in _micro_cases().items():
            rows.append((name, _measure(fn, _kiln_micro(fn, inputs), inputs)))
        for name, (module, inputs) in _models().items():
            rows.append((name, _measure(module, _kiln_model(module, inputs), inputs)))
    return rows


def main() -> str:
    rows = measure()
    lines = [
        f"threads: {THREADS}, median of {REPEATS} repeats; speedup = time of the other / kiln",
        "",
        "| case | eager ms | torch.compile ms | kiln ms | vs eager | vs torch.compile |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, t in rows:
        lines.append(
            f"| {name} | {t['eager']:.3f} | {t['torch.compile']:.3f} | {t['kiln']:.3f} "
            f"| {t['eager'] / t['kiln']:.2f}x | {t['torch.compile'] / t['kiln']:.2f}x |"
        )
    geo_eager = math.exp(statistics.mean(math.log(t["eager"] / t["kiln"]) for _, t in rows))
    geo_ic = math.exp(statistics.mean(math.log(t["torch.compile"] / t["kiln"]) for _, t in rows))
    lines.append(f"| geometric mean | | | | {geo_eager:.2f}x | {geo_ic:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
