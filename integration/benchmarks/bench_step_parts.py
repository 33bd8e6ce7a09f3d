"""Where a training step's host time goes on the GPU, part by part, mode by mode.

For each model (serving size, bf16, as ``bench_gpu_calls`` builds it) and mode (``kiln``,
``kiln reduce-overhead``, ``torch.compile``, ``torch.compile reduce-overhead``, as
``gpu_case.build_mode`` builds and checks them), after five warm-up steps: 30 back-to-back
training steps (the optimizer's ``zero_grad(set_to_none=True)``, forward, the loss
``out.float().square().mean()``, ``backward()``), with

- **host µs** per step and per part: the time the Python thread spends issuing each part
  (no synchronization inside the loop);
- **wall µs** per step: until the GPU has finished all 30 steps. Where wall equals host, the
  GPU waits for the host (compare with ``bench_gpu_calls``' GPU-busy time).

Environment: ``KILN_BENCH_MODELS`` (default ``bert``), ``KILN_BENCH_MODES``
(comma-separated, default the four above). Needs a CUDA GPU.
"""

from __future__ import annotations

import os
import time

import torch
from gpu_case import Case, build_mode, loss_of
from timing import markdown_table

STEPS = 30
WARMUP = 5
MODES = ("kiln reduce-overhead", "torch.compile reduce-overhead", "kiln", "torch.compile")
PARTS = ("zero_grad", "forward", "loss", "backward")
HEADER = ["model", "mode", "host µs", "wall µs", *(f"{p} µs" for p in PARTS)]


def step_parts(case: Case, fn) -> tuple[dict[str, float], float, float]:
    """Host µs per part and per step, and wall µs per step, over ``STEPS`` steps."""
    spent = dict.fromkeys(PARTS, 0.0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        a = time.perf_counter()
        case.optimizer.zero_grad(set_to_none=True)
        b = time.perf_counter()
        out = fn(*case.inputs)
        c = time.perf_counter()
        loss = loss_of(out)
        d = time.perf_counter()
        loss.backward()
        e = time.perf_counter()
        for part, seconds in zip(PARTS, (b - a, c - b, d - c, e - d), strict=True):
            spent[part] += seconds
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    per_step = {p: s / STEPS * 1e6 for p, s in spent.items()}
    return per_step, host / STEPS * 1e6, wall / STEPS * 1e6


def main() -> str:
    if not torch.cuda.is_available():
        return "bench_step_parts needs a CUDA GPU"
    models = os.environ.get("KILN_BENCH_MODELS", "bert").split(",")
    modes = os.environ.get("KILN_BENCH_MODES", ",".join(MODES)).split(",")
    rows = []
    for name in models:
        case = Case(name, "serving", "training")
        for mode in modes:
            fn, _ = build_mode(case, mode)
            for _ in range(WARMUP):
                case.step(fn)
            parts, host, wall = step_parts(case, fn)
            rows.append([name, mode, f"{host:.0f}", f"{wall:.0f}",
                         *(f"{parts[p]:.0f}" for p in PARTS)])  # fmt: skip
    return markdown_table(HEADER, rows, numeric=0)


if __name__ == "__main__":
    print(main())
