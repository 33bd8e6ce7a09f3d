"""Which kernels keep the GPU busy: Kiln's against torch.compile's, kernel name by name.

For each model and size of the GPU benchmark (bf16 inference under ``torch.no_grad()``,
batch norms with random statistics), Kiln (default mode) and ``torch.compile`` (default
mode) each run 4 warm-up calls and 5 profiled calls; per call: the GPU-busy time, the
number of device events, and the events that took the most time, summed by name with their
count (a name is one generated kernel, or one library kernel: ``nvjet_*`` is cuBLAS,
``*fprop*``/``conv*`` cuDNN). Read the two lists side by side to find the kernels one
compiler fuses and the other does not.

Environment: ``KILN_BENCH_MODELS`` (``model:size`` pairs, comma-separated; default
``gpt2:serving,resnet50:serving,convnext_tiny:serving``), ``KILN_BENCH_TOP`` (rows per list,
default 16). Needs a CUDA GPU.
"""

from __future__ import annotations

import copy
import os

import torch
from bench_conv_layout import randomized_norms
from gpu_models import build
from torch.profiler import ProfilerActivity, profile

import kiln

WARMUP, CALLS = 4, 5


def top_kernels(fn, inputs: list[torch.Tensor], top: int) -> str:
    with torch.no_grad():
        for _ in range(WARMUP):
            fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                fn(*inputs)
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    busy = sum(e.self_device_time_total for e in events) / CALLS
    count = sum(e.count for e in events) // CALLS
    rows = sorted((e.self_device_time_total / CALLS, e.count // CALLS, e.key) for e in events)
    lines = [f"{us:8.1f} µs x{n:3d}  {name[:110]}" for us, n, name in reversed(rows)][:top]
    return f"GPU-busy {busy:.0f} µs per call, {count} device events\n" + "\n".join(lines)


def main() -> str:
    if not torch.cuda.is_available():
        return "bench_kernels needs a CUDA GPU"
    specs = os.environ.get(
        "KILN_BENCH_MODELS", "gpt2:serving,resnet50:serving,convnext_tiny:serving"
    )
    top = int(os.environ.get("KILN_BENCH_TOP", "16"))
    report = []
    for spec in specs.split(","):
        name, size = spec.split(":")
        model, inputs = build(name, size)
        model = randomized_norms(model).eval()
        for label, compiled in (
            ("kiln", kiln.compile(copy.deepcopy(model))),
            ("torch.compile", torch.compile(copy.deepcopy(model))),
        ):
            report.append(f"## {name} {size}, {label}\n{top_kernels(compiled, inputs, top)}")
    return "\n\n".join(report)


if __name__ == "__main__":
    print(main())
