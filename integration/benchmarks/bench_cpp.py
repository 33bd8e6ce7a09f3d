"""kiln-cpp against eager and torch.compile's CPU backend (inductor), in one run.

Micro cases are traced to aten graphs with ``kiln_loopir.testing.trace_aten``; the Hugging
Face models (small configs, random weights, inference) with
``kiln_autograd.trace_inference_graph``, whose graph takes the parameters first. Both are
compiled with ``kiln_loopir.compile_fx(..., codegen="cpp")``; the models' inference again
through ``kiln.compile`` as a user calls it (under ``no_grad`` it freezes the parameters:
rows marked ``kiln.compile``). The same models' training steps (``zero_grad``, forward, a
squared-mean loss, ``backward()``; dropout off) go through ``kiln.compile`` and
``torch.compile`` whole, as ``bench_call_path.py`` times them, each variant's loss and
gradients checked against eager's first. Every variant runs with the
same ``torch.set_num_threads``, is warmed up, and is timed as the median of several
repeats; the variants take turns within each repeat so a busy machine slows them alike.
Each thread count runs in a child process of its own (inductor and kiln-cpp build their
OpenMP kernels for the count they see): one thread and every core by default, or the
comma-separated counts of ``KILN_BENCH_THREADS``. ``KILN_BENCH_MODELS=0`` leaves the
Hugging Face models out. The last rows are the geometric means of the speedups, over all
cases and over the micro cases, per thread count.

Run: ``cd integration && python bench.py cpp`` (or ``python benchmarks/bench_cpp.py``).
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from bench_call_path import measure_training
from timing import thread_counts

import kiln
import kiln_autograd
import kiln_loopir
from kiln_loopir.testing import trace_aten

REPEATS = 15
TARGET_S = 0.02  # each timing calls the function for about this long


def _micro_cases() -> dict[str, tuple[Callable, list[torch.Tensor]]]:
    n = 1024
    x, y = torch.randn(n, n), torch.randn(n, n)
    w, b = torch.randn(n), torch.randn(n)
    index = torch.randint(0, n, (n, 256))
    u, v = torch.randn(n * n), torch.randn(n * n)
    small_a, small_b = torch.randn(256, 1, 64), torch.randn(1, 256, 64)
    m1, m2, bias = torch.randn(256, 512), torch.randn(512, 512), torch.randn(512)
    tall = torch.randn(n * 64, 16)
    long_columns, long_rows = torch.randn(4096, 512), torch.randn(3, n * n)
    return {
        "pointwise chain (a*b+1).relu().sigmoid()": (
            lambda a, c: torch.sigmoid(torch.relu(a * c + 1)) * a,
            [x, y],
        ),
        "softmax rows": (lambda a: torch.softmax(a, -1), [x]),
        "layernorm + gelu": (lambda a, w, b: F.gelu(F.layer_norm(a, (n,), w, b)), [x, w, b]),
        "row sum": (lambda a: a.sum(-1), [x]),
        "column sum": (lambda a: a.sum(0), [x]),
        "full sum (1M)": (lambda a: a.sum(), [u]),
        "tall column sum (65536 x 16)": (lambda a: a.sum(0), [tall]),
        "long column sum (4096 x 512)": (lambda a: a.sum(0), [long_columns]),
        "few long rows sum (3 x 1M)": (lambda a: a.sum(-1), [long_rows]),
        "var_mean rows": (lambda a: torch.var_mean(a, -1), [x]),
        "transpose + add": (lambda a, c: a.t() + c, [x, y]),
        "gather rows": (lambda a, i: torch.gather(a, 1, i) * 2, [x, index]),
        "sin(x)*cos(x) + exp(x)*0.5 (1M)": (
            lambda a: torch.sin(a) * torch.cos(a) + torch.exp(a) * 0.5,
            [u],
        ),
        "cat([x.sin(), y.cos()]) * 3 (2 x 1M)": (
            lambda a, c: torch.cat([a.sin(), c.cos()]) * 3,
            [u, v],
        ),
        "row centring x - x.mean(-1)": (lambda a: a - a.mean(-1, keepdim=True), [x]),
        "gather + relu": (lambda a, i: torch.relu(torch.gather(a, 1, i)), [x, index]),
        "mm + bias + gelu (256x512 @ 512x512)": (
            lambda a, w, b: F.gelu(a @ w + b),
            [m1, m2, bias],
        ),
        "broadcast product-sum (256,1,64)*(1,256,64)": (
            lambda a, c: (a * c).sum(-1),
            [small_a, small_b],
        ),
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
                **common,
                hidden_size=256,
                intermediate_size=1024,
                max_position_embeddings=128,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
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
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
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
    return {name: (_Logits(m), [ids]) for name, m in configs.items()}


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


def _measure(fn: Callable, compiled: Callable, inputs: list) -> dict[str, float]:
    torch._dynamo.reset()
    inductor = torch.compile(fn, backend="inductor")
    expected = _first(fn(*inputs))
    for variant in (inductor, compiled):
        for _ in range(3):  # warm-up: compile, first-touch of the outputs
            got = _first(variant(*inputs))
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    return _time({"eager": fn, "torch.compile": inductor, "kiln": compiled}, inputs)


ROW = "ROW "  # a child process's result lines start with this


def run_threads(threads: int) -> None:
    """Measure every case with ``threads`` threads; print one ``ROW`` json line each."""
    torch.set_num_threads(threads)
    cases = [(name, fn, inputs, False) for name, (fn, inputs) in _micro_cases().items()]
    if os.environ.get("KILN_BENCH_MODELS", "1") != "0":
        cases += [(name, m, inputs, True) for name, (m, inputs) in _models().items()]
    with torch.no_grad():
        for name, fn, inputs, model in cases:
            if model:
                fn.eval()
            compiled = _kiln_model(fn, inputs) if model else _kiln_micro(fn, inputs)
            row = {"case": name, "threads": threads, "model": model}
            row["ms"] = _measure(fn, compiled, inputs)
            print(ROW + json.dumps(row), flush=True)
    for name, fn, inputs, model in cases:
        if model:  # inference as a user compiles it: the whole model, parameters frozen
            with torch.no_grad():
                kiln_model = kiln.compile(fn.eval())
                row = {"case": f"{name}, kiln.compile", "threads": threads, "model": True}
                row["ms"] = _measure(fn, kiln_model, inputs)
            print(ROW + json.dumps(row), flush=True)
            us, _ = measure_training(fn.train(), inputs)
            row = {"case": f"{name}, training step", "threads": threads, "model": True}
            row["ms"] = {variant: t / 1e3 for variant, t in us.items()}
            print(ROW + json.dumps(row), flush=True)


def measure() -> list[dict]:
    rows = []
    for threads in thread_counts():
        proc = subprocess.run(
            [sys.executable, __file__, "--threads", str(threads)], capture_output=True, text=True
        )
        found = [
            json.loads(ln[len(ROW) :]) for ln in proc.stdout.splitlines() if ln.startswith(ROW)
        ]
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the run with {threads} thread(s) failed: {last}")
        rows += found
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def main() -> str:
    load_before = os.getloadavg()[0]
    rows = measure()
    lines = [
        f"torch {torch.__version__}, {os.cpu_count()} cores (load average {load_before:.1f} "
        f"before, {os.getloadavg()[0]:.1f} after), median of {REPEATS} repeats; "
        "speedup = time of the other / kiln",
        "",
        "| case | threads | eager ms | torch.compile ms | kiln ms | vs eager | vs torch.compile |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        t = row["ms"]
        lines.append(
            f"| {row['case']} | {row['threads']} | {t['eager']:.3f} | {t['torch.compile']:.3f} "
            f"| {t['kiln']:.3f} | {t['eager'] / t['kiln']:.2f}x "
            f"| {t['torch.compile'] / t['kiln']:.2f}x |"
        )
    for threads in thread_counts():
        for label, chosen in (("all cases", lambda r: True), ("micro", lambda r: not r["model"])):
            ts = [r["ms"] for r in rows if r["threads"] == threads and chosen(r)]
            if not ts:
                continue
            geo_eager = _geomean([t["eager"] / t["kiln"] for t in ts])
            geo_ic = _geomean([t["torch.compile"] / t["kiln"] for t in ts])
            lines.append(
                f"| geometric mean, {label} | {threads} | | | | {geo_eager:.2f}x | {geo_ic:.2f}x |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--threads"]:
        run_threads(int(sys.argv[2]))
    else:
        print(main())
