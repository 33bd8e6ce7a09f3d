"""kiln-triton on the GPU against eager and torch.compile, in one run.

Memory-bound micro kernels (pointwise chains, a transpose, softmax, layernorm + gelu, row
and column reductions) report their achieved bandwidth as a fraction of a measured
device-to-device copy; every case, and Hugging Face / timm models in bfloat16 inference,
report times and speedups over eager and over ``torch.compile`` (default mode);
``KILN_BENCH_TRITON=micro`` or ``=models`` runs one half, ``KILN_BENCH_MODELS=bert,resnet50``
some of the models. Each time
is the median of ``triton.testing.do_bench`` (which clears the L2 cache between runs). The
models' outputs are checked against eager: the table gives kiln's largest difference from
an fp32 run of the same weights next to eager bf16's.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from timing import background_builds_finished

BF16 = torch.bfloat16
DEVICE = "cuda"


# -- micro cases ---------------------------------------------------------------------------------
def micro_cases():
    """(name, fn, make inputs, bytes an ideal kernel moves)."""

    def randn(*shape, dtype=torch.float32):
        return lambda: torch.randn(shape, device="cuda", dtype=dtype)

    def pointwise(a, b):
        return (a * 2 + b).relu() * torch.sigmoid(a) - b

    def layernorm_gelu(a, w, b):
        return F.gelu(F.layer_norm(a, (a.shape[-1],), w, b))

    big, rows = (16384, 4096), (32768, 1024)
    f32, bf = 4, 2
    n = big[0] * big[1]
    return [
        ("pointwise chain fp32 [16384,4096]", pointwise, [randn(*big), randn(*big)], 3 * n * f32),
        ("pointwise chain bf16 [16384,4096]", pointwise,
         [randn(*big, dtype=BF16), randn(*big, dtype=BF16)], 3 * n * bf),
        ("transpose + add fp32 [8192,8192]", lambda a, b: a.t() + b,
         [randn(8192, 8192), randn(8192, 8192)], 3 * 8192 * 8192 * f32),
        ("softmax fp32 [32768,1024]", lambda a: torch.softmax(a, -1), [randn(*rows)],
         2 * rows[0] * rows[1] * f32),
        ("softmax bf16 [32768,1024]", lambda a: torch.softmax(a, -1), [randn(*rows, dtype=BF16)],
         2 * rows[0] * rows[1] * bf),
        ("softmax fp32 [2048,32768] (looped)", lambda a: torch.softmax(a, -1),
         [randn(2048, 32768)], 2 * 2048 * 32768 * f32),
        ("layernorm+gelu bf16 [32768,1024]", layernorm_gelu,
         [randn(*rows, dtype=BF16), randn(1024, dtype=BF16), randn(1024, dtype=BF16)],
         2 * rows[0] * rows[1] * bf),
        ("layernorm+gelu fp32 [8192,4096]", layernorm_gelu,
         [randn(8192, 4096), randn(4096), randn(4096)], 2 * 8192 * 4096 * f32),
        ("row sum fp32 [16384,4096]", lambda a: a.sum(-1), [randn(*big)], n * f32),
        ("column sum fp32 [16384,4096]", lambda a: a.sum(0), [randn(*big)], n * f32),
        ("row max+argmax bf16 [16384,4096]", lambda a: a.max(-1),
         [randn(*big, dtype=BF16)], n * bf),
    ]  # fmt: skip


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read plus write)."""
    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.nbytes / (ms * 1e-3)


def compile_kiln_fn(fn, inputs):
    from kiln_loopir.testing import compile_fn
    from kiln_triton import TritonCodegen

    compiled = compile_fn(fn, inputs, codegen=TritonCodegen())
    return lambda *args: compiled(*args), len(compiled.kernels)


def time_all(kiln, eager, compiled, inputs) -> tuple[float, float, float]:
    """(kiln, eager, torch.compile) milliseconds on the same inputs."""
    background_builds_finished()
    with torch.no_grad():
        return (
            bench_ms(lambda: kiln(*inputs)),
            bench_ms(lambda: eager(*inputs)),
            bench_ms(lambda: compiled(*inputs)),
        )


def measure_micro(name, fn, makers, nbytes, copy_bps) -> list[str]:
    inputs = [m() for m in makers]
    kiln, nk = compile_kiln_fn(fn, inputs)
    got, want = kiln(*inputs), fn(*inputs)
    got = got if isinstance(want, tuple) else got[0]
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    compiled = torch.compile(fn)
    compiled(*inputs)
    t_kiln, t_eager, t_tc = time_all(kiln, fn, compiled, inputs)
    bw = nbytes / (t_kiln * 1e-3)
    return [
        name, f"{t_eager * 1e3:.0f}", f"{t_tc * 1e3:.0f}", f"{t_kiln * 1e3:.0f}",
        f"{bw / 1e9:.0f} ({100 * bw / copy_bps:.0f}%)",
        f"{nbytes / (t_tc * 1e-3) / copy_bps * 100:.0f}%",
        f"{t_eager / t_kiln:.2f}", f"{t_tc / t_kiln:.2f}", f"{nk} kernel(s)",
    ]  # fmt: skip


def run_micro(copy_bps: float) -> list[list[str]]:
    rows = []
    for name, fn, makers, nbytes in micro_cases():
        try:
            rows.append(measure_micro(name, fn, makers, nbytes, copy_bps))
        except Exception as exc:  # a failing case is a row, the others still run
            rows.append([name, "", "", "", "", "", "", "", f"error: {exc!r}"[:160]])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    return rows


# -- models ----------------------------------------------------------------------------------------
class LastHidden(torch.nn.Module):
    """A Hugging Face model returning its last hidden state (a tensor, not an output class)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids).last_hidden_state


def bert(batch=16, seq=256, layers=12):
    from transformers import BertConfig, BertModel

    model = LastHidden(BertModel(BertConfig(num_hidden_layers=layers)))
    return model, [torch.randint(0, 30522, (batch, seq))]


def gpt2(batch=16, seq=256, layers=12):
    from transformers import GPT2Config, GPT2Model

    model = LastHidden(GPT2Model(GPT2Config(use_cache=False, n_layer=layers)))
    return model, [torch.randint(0, 50257, (batch, seq))]


def llama(batch=8, seq=256, layers=8):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                         max_position_embeddings=1024, use_cache=False)  # fmt: skip
    return LastHidden(LlamaModel(config)), [torch.randint(0, 32000, (batch, seq))]


def timm_model(name: str, batch=32, **kwargs):
    def build():
        import timm

        model = timm.create_model(name, pretrained=False, **kwargs)
        return model, [torch.randn(batch, 3, 224, 224)]

    return build


MODELS = {
    "bert-base": bert,
    "gpt2": gpt2,
    "llama (1024 wide, 8 layers)": llama,
    "resnet50": timm_model("resnet50"),
    "vit_base_patch16_224": timm_model("vit_base_patch16_224"),
    "convnext_tiny": timm_model("convnext_tiny"),
}


def kiln_backend(stats: dict):
    """A ``torch.compile``-style backend: kiln-autograd's inference graph, kiln-loopir's
    schedule, kiln-triton's kernels. While ``stats["cudagraphs"]`` is true, calls replay
    through kiln-cudagraphs (as ``mode="reduce-overhead"`` does)."""
    import kiln_autograd
    import kiln_cudagraphs
    from kiln_autograd.lift import lift
    from kiln_loopir import compile_fx
    from kiln_triton import TritonCodegen

    def backend(gm, example_inputs):
        graph = kiln_autograd.trace_inference_graph(gm, example_inputs)
        state = lift(gm).state()
        compiled = compile_fx(graph.gm, [*state, *example_inputs], codegen=TritonCodegen())
        replayed = kiln_cudagraphs.wrap(compiled, [*state, *example_inputs])
        stats["kernels"] = stats.get("kernels", 0) + len(compiled.kernels)
        stats["graphs"] = stats.get("graphs", 0) + 1
        stats["native"] = stats.get("native", 0) + (compiled.program.native is not None)
        return lambda *args: (replayed if stats.get("cudagraphs") else compiled)(*state, *args)

    return backend


def prepare_model(build):
    torch.manual_seed(0)
    model, inputs = build()
    model = model.eval().to(DEVICE, BF16)
    inputs = [x.to(DEVICE, BF16) if x.is_floating_point() else x.to(DEVICE) for x in inputs]
    return model, inputs


def check_model(model, inputs, kiln) -> tuple[float, float, float]:
    """(kiln's and eager bf16's largest difference from fp32, the output's largest value)."""
    with torch.no_grad():
        got = kiln(*inputs)
        want = model(*inputs)
        reference = model.float()(*[x.float() if x.is_floating_point() else x for x in inputs])
        model.to(BF16)
    scale = reference.abs().max().item()
    err_kiln = (got.float() - reference).abs().max().item()
    err_eager = (want.float() - reference).abs().max().item()
    return err_kiln, err_eager, scale


def measure_model(name, build) -> list[str]:
    import kiln_capture

    model, inputs = prepare_model(build)
    stats: dict = {}
    start = time.perf_counter()
    kiln = kiln_capture.capture(model, kiln_backend(stats))
    with torch.no_grad():
        kiln(*inputs)
    kiln_compile_s = time.perf_counter() - start
    if not stats:
        raise RuntimeError("kiln-capture ran the model eagerly (no graph compiled)")
    err_kiln, err_eager, scale = check_model(model, inputs, kiln)
    start = time.perf_counter()
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(*inputs)
    tc_compile_s = time.perf_counter() - start
    t_kiln, t_eager, t_tc = time_all(kiln, model, compiled, inputs)
    graphs = cuda_graph_times(model, inputs, kiln, stats)
    return [
        f"{name} bf16 {list(inputs[0].shape)}", f"{t_eager * 1e3:.0f}",
        f"{t_tc * 1e3:.0f}", f"{t_kiln * 1e3:.0f}", "", "",
        f"{t_eager / t_kiln:.2f}", f"{t_tc / t_kiln:.2f}",
        f"{stats['kernels']} kernels in {stats['graphs']} graph(s); max err vs fp32 "
        f"kiln {err_kiln:.3g} / eager {err_eager:.3g} (outputs up to {scale:.3g}); compile "
        f"kiln {kiln_compile_s:.0f} s, torch.compile {tc_compile_s:.0f} s; {graphs}",
    ]  # fmt: skip


def cuda_graph_times(model, inputs, kiln, stats: dict) -> str:
    """Both compilers replaying CUDA graphs: kiln through kiln-cudagraphs, torch.compile
    in mode="reduce-overhead"."""
    stats["cudagraphs"] = True
    try:
        with torch.no_grad():
            for _ in range(3):  # warm-up, capture, first replay
                got = kiln(*inputs)
            torch.testing.assert_close(got.float(), model(*inputs).float(), atol=0.15, rtol=0.05)
        reduce_overhead = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                reduce_overhead(*inputs)
            t_kiln = bench_ms(lambda: kiln(*inputs))
            t_tc = bench_ms(lambda: reduce_overhead(*inputs))
    finally:
        stats["cudagraphs"] = False
    return (
        f"CUDA graphs: kiln {t_kiln * 1e3:.0f} µs, torch.compile reduce-overhead "
        f"{t_tc * 1e3:.0f} µs ({t_tc / t_kiln:.2f}×)"
    )


def run_models() -> list[list[str]]:
    """Each model in a process of its own: one model's CUDA graphs, caches and memory
    pools (kiln's and torch.compile's) must not reach the next (in one process, the model
    after BERT once failed with an unspecified launch failure)."""
    rows = []
    chosen = os.environ.get("KILN_BENCH_MODELS", "")  # a comma-separated subset of MODELS
    for name in MODELS:
        if chosen and not any(c and name.startswith(c) for c in chosen.split(",")):
            continue
        proc = subprocess.run(
            [sys.executable, __file__, "--model", name], capture_output=True, text=True
        )
        found = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
        if found:
            rows.append(found[-1].strip("| ").split(" | "))
        else:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            rows.append([name, "", "", "", "", "", "", "", f"error: {last}"[:200]])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)  # kept if a later one hangs
    return rows


def run_one_model(name: str) -> None:
    try:
        row = measure_model(name, MODELS[name])
    except Exception as exc:  # a failing model is a row, the others still run
        row = [name, "", "", "", "", "", "", "", f"error: {exc!r}"[:200]]
    print("| " + " | ".join(row) + " |", flush=True)


def main() -> str:
    if not torch.cuda.is_available():
        return "bench_triton: needs a CUDA GPU (kiln-triton's kernels run on CUDA devices)"
    copy_bps = copy_bandwidth()
    rows = [["device-to-device copy 1 GiB", "", "", "", f"{copy_bps / 1e9:.0f} (100%)", "",
             "", "", torch.cuda.get_device_name()]]  # fmt: skip
    parts = os.environ.get("KILN_BENCH_TRITON", "micro,models").split(",")
    if "micro" in parts:
        rows += run_micro(copy_bps)
    if "models" in parts:
        rows += run_models()
    header = ["case", "eager µs", "torch.compile µs", "kiln µs", "kiln GB/s (% of copy)",
              "torch.compile % of copy", "× eager", "× torch.compile", "note"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * 7 + "---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n\n" + "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--model"]:
        run_one_model(sys.argv[2])
    else:
        print(main())
