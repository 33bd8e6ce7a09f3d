"""Compile time: Kiln against torch.compile, with empty caches and then warm, in one run.

For each model and phase (inference under ``torch.no_grad()``, and a training step:
forward, ``loss.backward()`` with the loss ``out.float().square().mean()``), each compiler
runs its first call in a fresh process whose caches are an empty folder (**cold**), then
once more in a second fresh process on the same folder (**warm**). The time is the first
call, compile included, from the compiled callable's creation to the end of the call. The
model is built, and called once eagerly, before the clock starts: an eager first call
starts what any PyTorch program starts at its first call (CUDA's lazily loaded modules,
cuBLAS and cuDNN handles, cuDNN's kernels compiled for each convolution's shape), which is
no compiler's work; the table shows what that first eager call took. Kiln's row adds
its compile time by stage (:func:`kiln.compile_times`) and the kernels it built and
found already built (``kernel_counts`` of the code generators), for both processes.
kiln-cpp's host runtime is part of the installation, built once (not per cache): the run
builds it first, if it is missing, and reports how long that took above the table.

Each measurement runs in a process of its own. Environment:

- ``KILN_BENCH_DEVICE``: ``cpu`` (HF BERT and GPT-2 with 2 layers, 8x128 tokens, float32)
  or ``cuda`` (the GPU benchmark's models at the serving size, bf16; default: ``cuda`` where
  there is one);
- ``KILN_BENCH_MODELS``: model names (prefixes, comma-separated, or ``all``);
- ``KILN_BENCH_PHASES``: inference, training, or ``all`` (default ``all``);
- ``KILN_BENCH_COMPILERS``: kiln, torch.compile, or ``all`` (default ``all``);
- ``KILN_BENCH_BUDGET_S``: seconds for the whole run (default 540): cases left when it is
  spent are listed as skipped;
- ``KILN_BENCH_TIMELINE=1``: below the table, the timeline of each Kiln first call, cold
  and warm (:func:`kiln.compile_timeline`'s stages and the compile workers' jobs, by
  thread, seconds from the call's start);
- ``KILN_BENCH_PROFILE=1``: below that, where each stage of 0.1 s or more spent its time
  (every thread's stack sampled each 5 ms during the call, :mod:`stack_samples`; the
  sampling slows the call a few percent).

Run ``python bench_compile.py`` (or ``python integration/bench.py compile`` on the CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from bench_gpu_calls import pick
from timing import markdown_table

PHASES = ("inference", "training")
COMPILERS = ("kiln", "torch.compile")
CPU_MODELS = ("bert", "gpt2")
ROW = "ROW "
HEADER = ["model", "phase", "compiler", "cold s", "warm s", "kiln ÷ tc cold", "kiln ÷ tc warm",
          "eager 1st call s (cold; warm)", "cold stages s", "warm stages s",
          "kernels built / reused (cold; warm)"]  # fmt: skip


def device() -> str:
    wanted = os.environ.get("KILN_BENCH_DEVICE", "")
    return wanted or ("cuda" if torch.cuda.is_available() else "cpu")


def model_names(on: str) -> list[str]:
    if on == "cpu":
        return list(CPU_MODELS)
    from gpu_models import NAMES

    return list(NAMES)


# --- one measurement, in a process of its own ---------------------------------------------


def cpu_model(name: str):
    """HF BERT or GPT-2 with 2 layers (hidden 256), random weights, 8x128 tokens."""
    from gpu_models import NO_DROPOUT, LastHidden

    torch.manual_seed(0)
    if name == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                            intermediate_size=1024, **NO_DROPOUT)  # fmt: skip
        model = LastHidden(BertModel(config))
    else:
        from transformers import GPT2Config, GPT2Model

        config = GPT2Config(n_layer=2, n_embd=256, n_head=4, use_cache=False,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
        model = LastHidden(GPT2Model(config))
    return model, [torch.randint(0, config.vocab_size, (8, 128))]


def build(name: str, on: str):
    if on == "cpu":
        return cpu_model(name)
    from gpu_models import build as build_gpu

    return build_gpu(name, "serving", on)


def kiln_kernel_counts() -> dict[str, int]:
    """Kernels built and reused in this process, over the code generators that are loaded."""
    counts = {"built": 0, "reused": 0}
    for module in ("kiln_cpp", "kiln_triton"):
        if module in sys.modules:
            for key, value in sys.modules[module].kernel_counts().items():
                counts[key] += value
    return counts


def measure(name: str, phase: str, compiler: str, on: str) -> dict:
    model, inputs = build(name, on)
    if phase == "inference":
        model.eval()
    if compiler == "kiln":
        import kiln

        kiln.set_logs(progress=False)
    eager_first = first_call(model, inputs, phase, on)  # the libraries' start, not timed
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    sampler = None
    if compiler == "kiln" and os.environ.get("KILN_BENCH_PROFILE") == "1":
        from stack_samples import StackSampler

        sampler = StackSampler().start()
    started = time.perf_counter()
    compiled = kiln.compile(model) if compiler == "kiln" else torch.compile(model)
    row = {"seconds": first_call(compiled, inputs, phase, on), "eager_first": eager_first}
    if compiler == "kiln":
        row["stages"] = kiln.compile_times()
        row["kernels"] = kiln_kernel_counts()
        if os.environ.get("KILN_BENCH_TIMELINE") == "1":
            row["timeline"] = timeline(started)
        if sampler is not None:
            from stack_samples import profile_text

            row["profile"] = profile_text(sampler.stop(), timeline(started), started)
    return row


def timeline(started: float) -> list[list]:
    """[start, end, thread, what] of each compile stage and compile-worker job, in seconds
    from ``started``, by start."""
    import kiln

    events = [
        [e["start"] - started, e["end"] - started, e["thread"],
         f"{e['frame']} {e['stage']}" + (f": {e['what']}" if e["what"] else "")]
        for e in kiln.compile_timeline()
    ]  # fmt: skip
    try:
        from kiln_triton.compile_pool import job_times
    except ImportError:
        job_times = list
    for job in job_times():
        launcher = f", launcher {job['launcher']:.2f} s" if job["launcher"] else ""
        seconds = f" (worker {job['seconds']:.2f} s{launcher})" if job["seconds"] else " (failed)"
        events.append([job["submitted"] - started, job["ended"] - started, "compile worker",
                       f"{job['function']} {job['options']}{seconds}"])  # fmt: skip
    return sorted(events)


def timeline_text(label: str, events: list[list], least: float = 0.005) -> str:
    """The events that took ``least`` seconds or more, one a line."""
    lines = [f"{label}: start, end, seconds, thread, what (each taking {least} s or more)"]
    lines += [f"{s:8.3f} {e:8.3f} {e - s:7.3f}  {thread:<22} {what}"
              for s, e, thread, what in events if e - s >= least]  # fmt: skip
    return "\n".join(lines)


def first_call(model, inputs: list, phase: str, on: str) -> float:
    """Seconds of ``model``'s call in ``phase`` (a training step: forward, then backward of
    ``out.float().square().mean()``), to the end of its device work."""
    if on == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    if phase == "inference":
        with torch.no_grad():
            model(*inputs)
    else:
        model(*inputs).float().square().mean().backward()
    if on == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def build_runtime() -> str:
    """kiln-cpp's host runtime, built if this installation lacks it: what it cost."""
    from kiln_cpp.host.runtime import load_runtime, runtime_dir

    start = time.perf_counter()
    load_runtime()
    seconds = time.perf_counter() - start
    return f"kiln-cpp host runtime (once per installation, in {runtime_dir()}): {seconds:.1f} s"


def child(name: str, phase: str, compiler: str, on: str) -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = measure(name, phase, compiler, on)
    row["warnings"] = [str(w.message)[:200] for w in caught if "kiln" in str(w.message)]
    print(ROW + json.dumps(row), flush=True)


# --- the run ---------------------------------------------------------------------------


def run_child(name: str, phase: str, compiler: str, on: str, folder: str) -> dict:
    """One measurement in a fresh process whose caches all lie in ``folder``."""
    env = dict(os.environ, KILN_CACHE_DIR=folder, TORCHINDUCTOR_CACHE_DIR=f"{folder}/inductor",
               TRITON_CACHE_DIR=f"{folder}/triton-tc")  # fmt: skip
    for own in ("KILN_CPP_CACHE_DIR", "KILN_TRITON_CACHE_DIR", "KILN_LOGS", "KILN_DEBUG"):
        env.pop(own, None)
    cmd = [sys.executable, __file__, "--child", name, phase, compiler, on]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=590)
    for line in proc.stdout.splitlines():
        if line.startswith(ROW):
            return json.loads(line[len(ROW) :])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:240]}


def stages_text(stages: dict[str, float]) -> str:
    order = sorted(stages.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.2f}" for k, v in order if v >= 0.01)


def kernels_text(cold: dict, warm: dict) -> str:
    def one(row: dict) -> str:
        k = row.get("kernels") or {}
        return f"{k.get('built', 0)} / {k.get('reused', 0)}"

    return f"{one(cold)}; {one(warm)}"


def main() -> str:
    on = device()
    models = pick("KILN_BENCH_MODELS", "all", model_names(on))
    phases = pick("KILN_BENCH_PHASES", "all", PHASES)
    compilers = pick("KILN_BENCH_COMPILERS", "all", COMPILERS)
    deadline = time.monotonic() + float(os.environ.get("KILN_BENCH_BUDGET_S", "540"))
    rows, skipped, timelines = [], [], []
    runtime = subprocess.run([sys.executable, __file__, "--runtime"], capture_output=True,
                             text=True).stdout.strip()  # fmt: skip
    for name in models:
        for phase in phases:
            results = {}
            for compiler in compilers:
                if time.monotonic() > deadline:
                    skipped.append(f"{name} {phase} {compiler}")
                    continue
                with tempfile.TemporaryDirectory(prefix="kiln-bench-compile-") as folder:
                    cold = run_child(name, phase, compiler, on, folder)
                    warm = run_child(name, phase, compiler, on, folder)
                results[compiler] = (cold, warm)
                for when, row in (("cold", cold), ("warm", warm)):
                    label = f"{name} {phase} {compiler}, {when}"
                    if "timeline" in row:
                        timelines.append(timeline_text(label, row.pop("timeline")))
                    if "profile" in row:
                        timelines.append(f"{label}, sampled stacks:\n{row.pop('profile')}")
                print(f"{name} {phase} {compiler}: cold {cold}, warm {warm}", file=sys.stderr)
            rows.extend(table_rows(name, phase, results))
    text = markdown_table(HEADER, rows, numeric=0)
    threads = torch.get_num_threads()
    text = f"device {on}, torch {torch.__version__}, {threads} threads; {runtime}\n\n{text}"
    if skipped:
        text += f"\n\nskipped (budget spent): {', '.join(skipped)}"
    return "\n\n".join([text, *timelines])


def table_rows(name: str, phase: str, results: dict) -> list[list[str]]:
    tc = results.get("torch.compile")
    rows = []
    for compiler, (cold, warm) in results.items():
        if "error" in cold or "error" in warm:
            error = cold.get("error") or warm["error"]
            rows.append([name, phase, compiler, "", "", "", "", "", "", "", error])
            continue
        ratio_cold = ratio_warm = ""
        if compiler == "kiln" and tc and "seconds" in tc[0] and "seconds" in tc[1]:
            ratio_cold = f"{cold['seconds'] / tc[0]['seconds']:.2f}"
            ratio_warm = f"{warm['seconds'] / tc[1]['seconds']:.2f}"
        kiln_row = compiler == "kiln"
        rows.append([
            name, phase, compiler, f"{cold['seconds']:.2f}", f"{warm['seconds']:.2f}",
            ratio_cold, ratio_warm, f"{cold['eager_first']:.2f}; {warm['eager_first']:.2f}",
            stages_text(cold.get("stages", {})) if kiln_row else "",
            stages_text(warm.get("stages", {})) if kiln_row else "",
            kernels_text(cold, warm) if kiln_row else "",
        ])  # fmt: skip
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "--runtime":
        print(build_runtime())
    else:
        print(main())
