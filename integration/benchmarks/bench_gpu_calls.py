"""Where a call's time goes on the GPU: Kiln against eager and torch.compile, in one run.

For each model, size and phase (bf16 inference under ``torch.no_grad()``, and a training
step: the optimizer's ``zero_grad(set_to_none=True)``, forward, ``loss.backward()`` with
the loss ``out.float().square().mean()``), and each mode (eager, ``torch.compile``,
``torch.compile(mode="reduce-overhead")``, ``kiln launches`` = ``kiln.compile`` with
``options={"cudagraphs": False}`` (every kernel launched by the host program), ``kiln.compile``
(the default mode: big graphs replay CUDA graphs with fresh outputs) and
``kiln.compile(mode="reduce-overhead")``; in training also both Kiln modes with
``options={"direct_gradients": True}``, rows ``kiln direct-gradients`` and
``kiln reduce-overhead direct-gradients``: the backward writes ``.grad`` itself):

- **wall µs**: ``n`` back-to-back calls between two ``torch.cuda.synchronize()``, over
  ``n``; the median of repeats in which the modes take turns;
- **GPU-busy µs**, **kernels**, **memcpy/memset** and **host launch calls** per call, from
  ``torch.profiler`` over a few calls (see ``gpu_timing``); **wall / busy** says how much of
  a call the GPU waits for the host (1.0: never).

Before it is timed, every mode is warmed up and checked against eager (outputs; in training
the loss and the gradients, within bf16 tolerances); Kiln must have compiled with no
fallback warning (``kiln_checks``). After the timing, a CUDA-graph mode must be replaying
(a profiled call shows a ``cudaGraphLaunch``; for Kiln, kiln-cudagraphs' counters show
replays and no call without a graph), else its row says "not engaged" instead of numbers.
Nothing is profiled before every mode is timed: once ``torch.profiler`` has traced CUDA
activity, CUPTI stays attached to the process and every later CUDA call costs more (a
BERT training step's host time grew 30-50 % on the H100's host), which would slow the
modes timed after a profiled one.

Each (model, size, phase) runs in a process of its own. Environment:

- ``KILN_BENCH_MODELS``: bert, gpt2, llama, resnet50, vit_base_patch16_224, convnext_tiny,
  mobilenetv3_large_100
  (prefixes, comma-separated, or ``all``; default ``bert,resnet50``);
- ``KILN_BENCH_SIZES``: serving (text 8x128, images 8), throughput (text 32x512, images 64),
  or ``all`` (default ``serving``);
- ``KILN_BENCH_PHASES``: inference, training, or ``all`` (default ``all``);
- ``KILN_BENCH_BUDGET_S``: seconds for the whole run (default 480): cases left when it is
  spent are listed as skipped, so one device command stays within 10 minutes.

``python bench_gpu_calls.py --dry-run`` lists the cases the environment picks (no GPU needed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch
from gpu_models import NAMES, SIZES
from timing import markdown_table

PHASES = ("inference", "training")
ROW = "ROW "
HEADER = ["model", "input", "phase", "mode", "wall µs", "GPU-busy µs", "wall / busy",
          "kernels", "memcpy+memset", "host launch calls", "note"]  # fmt: skip


def pick(variable: str, default: str, known) -> list[str]:
    """The entries of ``known`` named (by prefix) in ``$variable``."""
    given = os.environ.get(variable, default).strip()
    if given == "all":
        return list(known)
    wanted = [w.strip() for w in given.split(",") if w.strip()]
    unknown = [w for w in wanted if not any(k.startswith(w) for k in known)]
    if unknown:
        raise SystemExit(f"{variable}={given!r}: {unknown} match none of {list(known)}")
    return [k for k in known if any(k.startswith(w) for w in wanted)]


def planned_cases() -> list[tuple[str, str, str]]:
    models = pick("KILN_BENCH_MODELS", "bert,resnet50", NAMES)
    sizes = pick("KILN_BENCH_SIZES", "serving", SIZES)
    phases = pick("KILN_BENCH_PHASES", "all", PHASES)
    return [(m, s, p) for m in models for s in sizes for p in phases]


def format_row(row: dict) -> list[str]:
    """A table row from a child's result (``profile`` None: no numbers, the note says why)."""
    head = [row["model"], row["input"], row["phase"], row["mode"]]
    prof, wall = row.get("profile"), row.get("wall_us")
    if wall is None:
        return head + [""] * 6 + [row["note"][:240]]
    if prof is None:
        return head + [f"{wall:.0f}"] + [""] * 5 + [row["note"][:240]]
    ratio = f"{wall / prof['busy_us']:.2f}" if prof["busy_us"] > 0 else ""
    return head + [
        f"{wall:.0f}",
        f"{prof['busy_us']:.0f}",
        ratio,
        f"{prof['kernels']:.1f}",
        f"{prof['copies']:.1f}",
        f"{prof['host_launch_calls']:.1f}",
        row["note"][:240],
    ]


def table(rows: list[dict]) -> str:
    return markdown_table(HEADER, [format_row(r) for r in rows], numeric=6)


def run_child(case: tuple[str, str, str], timeout: float) -> list[dict]:
    model, size, phase = case
    blank = {"model": model, "input": size, "phase": phase, "mode": "all"}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--case", *case],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        found = [json.loads(x[len(ROW) :]) for x in out.splitlines() if x.startswith(ROW)]
        return found + [{**blank, "note": f"stopped after {timeout:.0f} s"}]
    found = [json.loads(x[len(ROW) :]) for x in proc.stdout.splitlines() if x.startswith(ROW)]
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        found.append({**blank, "note": f"error (exit {proc.returncode}): {last}"})
    return found


def main() -> str:
    cases = planned_cases()
    if "--dry-run" in sys.argv or os.environ.get("KILN_BENCH_DRY_RUN") == "1":
        return "bench_gpu_calls, dry run: would run\n" + "\n".join(" ".join(c) for c in cases)
    if not torch.cuda.is_available():
        return "bench_gpu_calls: needs a CUDA GPU (run it through integration/gpu.py)"
    budget = float(os.environ.get("KILN_BENCH_BUDGET_S", "480"))
    started = time.perf_counter()
    rows: list[dict] = []
    for case in cases:
        left = budget - (time.perf_counter() - started)
        if left < 30:
            blank = dict(zip(("model", "input", "phase"), case, strict=True))
            rows.append({**blank, "mode": "all", "note": "skipped: KILN_BENCH_BUDGET_S spent"})
            continue
        for row in run_child(case, left):
            rows.append(row)
            print("| " + " | ".join(format_row(row)) + " |", file=sys.stderr, flush=True)
    intro = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; per call; wall / busy "
        "= wall time over GPU-busy time (1.0: the GPU never waits for the host)"
    )
    return f"{intro}\n\n{table(rows)}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--case"]:
        from gpu_case import run_case

        run_case(*sys.argv[2:5], emit=lambda row: print(ROW + json.dumps(row), flush=True))
    else:
        print(main())
