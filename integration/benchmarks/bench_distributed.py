"""Distributed training steps on 2 GPUs: Kiln against eager and torch.compile, in one run.

Each rank is a process of its own (``torch.multiprocessing`` spawn, NCCL on
``127.0.0.1``, ``world_size = min(2, torch.cuda.device_count())``); one spawn runs every
case, each (model, wrapper, mode) built fresh in the same ranks:

- **models** (Hugging Face, built from configs with random weights, no dropout, nothing
  downloaded): GPT-2 small with its LM head (12 layers, 768 wide, 124M parameters) and a
  Llama (8 layers, 1024 wide, grouped-query attention, 32k vocabulary, untied LM head:
  160M parameters); the loss is the model's own LM loss (``labels=input_ids``);
- **wrappers**: ``DistributedDataParallel`` (default buckets), and FSDP2
  (``fully_shard`` on each transformer block and on the root, on a 1-D device mesh);
- **modes**: eager, ``torch.compile(model)`` (inductor, default mode) and
  ``kiln.compile(model)``, each applied to the wrapped model as a user would;
- **precision** on the GPU: float32 parameters and optimizer; under DDP the forward and
  the loss run under ``torch.autocast(bfloat16)``, under FSDP2 through
  ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` (gradients are
  reduced in float32 in both);
- **a step**: forward with the loss, ``backward()``, ``SGD(lr=1e-3, momentum=0.9).step()``,
  ``zero_grad(set_to_none=True)``, on 8 sequences of 512 tokens per rank (each rank its
  own random tokens, the same in every mode; the steps cycle through 4 batches). SGD
  rather than AdamW so that the losses can be compared over the steps (``dist_case``
  says why); the optimizer runs eagerly in every mode.

Each case runs ``KILN_BENCH_WARMUP`` steps (compiles happen there), is checked engaged,
then:

- **ms/step**: the median over ``KILN_BENCH_STEPS`` steps, each timed on rank 0 from its
  start to a ``torch.cuda.synchronize()`` after it (the collectives keep the ranks in
  step); the note gives the mean where it is 10 % above the median;
- **profiled ms/step** (the steps' time under the profiler, on rank 0), **compute
  ms/step**, **comm ms/step**, **comm hidden**, **exposed comm ms/step**: from
  ``torch.profiler`` over ``KILN_BENCH_PROFILE_STEPS`` more steps once every mode of the
  (model, wrapper) is timed (a profiler slows every later CUDA call of its process:
  ``gpu_timing.profile_calls``; the modes are kept until then), read on rank 0 (every
  rank profiles, after a barrier and one step that starts the tracing, so that they are
  slowed alike), from the device kernels' intervals (``comm_overlap``): communication is
  the union of the intervals of kernels named ``*nccl*``, compute the union of every
  other kernel's; the hidden share is the length of their intersection over the
  communication time (a kernel can only overlap kernels of other streams, so this is
  communication running while compute runs), the exposed time what is left. An NCCL
  kernel's time includes waiting for the other rank: where a step is bound by the host,
  communication kernels can wait for the other rank's host for much of the step;
- **loss max rel diff**: the largest ``|loss - eager's| / |eager's|`` on rank 0 over the
  warm-up and timed steps (same weights, same batches, same order): "agrees" within 1e-2
  in bfloat16 (1e-3 in float32). On the CPU (float32, 2x128 tokens), two runs of GPT-2
  whose weights differ by 1e-3 (relative) stayed within 1e-4 of each other over 20 steps,
  and gradients twice too large moved the loss by 6e-2.

Engaged: ``torch.compile`` must have captured graphs (``torch._dynamo``'s
``unique_graphs`` counter grew during the warm-up; its graph breaks are counted too);
``kiln.compile`` must have spent time in its compile stages after capture
(``kiln.compile_times()`` since ``kiln.reset()``: lowering, code generation, or its
cache). Every warning raised during a case is recorded and listed above the table;
Kiln's "runs eagerly" warnings make its row "partly eager". A mode that is not engaged
gets no figures; a mode that raises gets an error cell and the run goes on.

Environment (names are prefixes, comma-separated):

- ``KILN_BENCH_DEVICE``: ``cuda`` (default; NCCL) or ``cpu`` (gloo, float32, no
  profiler figures: for developing the benchmark);
- ``KILN_BENCH_TINY=1``: 2-layer, 64-wide models, 2 sequences of 32 tokens;
- ``KILN_BENCH_MODELS`` (gpt2, llama), ``KILN_BENCH_WRAPPERS`` (ddp, fsdp),
  ``KILN_BENCH_MODES`` (eager, torch.compile, kiln; exact names): default all;
- ``KILN_BENCH_WARMUP`` (5), ``KILN_BENCH_STEPS`` (20), ``KILN_BENCH_PROFILE_STEPS`` (3),
  ``KILN_BENCH_BATCH`` and ``KILN_BENCH_SEQ`` (per rank);
- ``KILN_BENCH_BUDGET_S`` (360): no case starts after this many seconds (one already
  running finishes; the cases left are listed as skipped);
- ``KILN_BENCH_TIMEOUT_S`` (300): the collectives' timeout, after which a rank stuck
  waiting for another that failed ends the run (the finished cases are still reported).

Run ``python3 integration/benchmarks/bench_distributed.py`` (``gpu.py`` runs it as
``KILN_GPU_BENCH=distributed``); on the CPU:
``KILN_BENCH_DEVICE=cpu KILN_BENCH_TINY=1 python3 integration/benchmarks/bench_distributed.py``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dist_case import (
    MODELS,
    MODES,
    WRAPPERS,
    Settings,
    environment,
    profile_case,
    release,
    run_case,
)

HEADER = ["model", "wrapper", "mode", "ms/step", "speed-up vs eager", "profiled ms/step",
          "compute ms/step", "comm ms/step", "comm hidden", "exposed comm ms/step",
          "warm-up s", "loss max rel diff vs eager", "note"]  # fmt: skip
RIGHT = range(3, 11)  # the numeric columns
AGREES = {True: 1e-2, False: 1e-3}  # relative loss tolerance, by bf16


def chosen(variable: str, known: tuple[str, ...], exact: bool = False) -> tuple[list, list]:
    """(the entries of ``known`` that ``$variable`` names, the names that match none)."""
    given = [w.strip() for w in os.environ.get(variable, "").split(",") if w.strip()]
    if not given or given == ["all"]:
        return list(known), []

    def match(k: str, w: str) -> bool:
        return k == w if exact else k.startswith(w)

    unknown = [f"{variable}:{w}" for w in given if not any(match(k, w) for k in known)]
    return [k for k in known if any(match(k, w) for w in given)], unknown


def number(variable: str, default: float) -> float:
    return float(os.environ.get(variable, default))


def read_settings() -> Settings:
    tiny = os.environ.get("KILN_BENCH_TINY", "").strip().lower() in ("1", "true", "on", "yes")
    models, bad_models = chosen("KILN_BENCH_MODELS", MODELS)
    wrappers, bad_wrappers = chosen("KILN_BENCH_WRAPPERS", WRAPPERS)
    modes, bad_modes = chosen("KILN_BENCH_MODES", MODES, exact=True)
    return Settings(
        device=os.environ.get("KILN_BENCH_DEVICE", "cuda").strip() or "cuda",
        tiny=tiny,
        models=tuple(models),
        wrappers=tuple(wrappers),
        modes=tuple(modes),
        batch=int(number("KILN_BENCH_BATCH", 2 if tiny else 8)),
        seq=int(number("KILN_BENCH_SEQ", 32 if tiny else 512)),
        warmup=max(1, int(number("KILN_BENCH_WARMUP", 5))),
        steps=max(1, int(number("KILN_BENCH_STEPS", 20))),
        profile_steps=max(0, int(number("KILN_BENCH_PROFILE_STEPS", 3))),
        budget_s=number("KILN_BENCH_BUDGET_S", 360),
        timeout_s=number("KILN_BENCH_TIMEOUT_S", 300),
        ignored=tuple(bad_models + bad_wrappers + bad_modes),
    )


# --- the ranks ------------------------------------------------------------------------------


def worker(rank: int, world: int, port: int, settings: Settings, results: str) -> None:
    """One rank: every case in turn; rank 0 appends each case's row to ``results``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = settings.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    else:  # the ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=settings.timeout_s),
        device_id=torch.device("cuda", rank) if cuda else None,
    )
    deadline = time.monotonic() + settings.budget_s
    try:
        for name in settings.models:
            for wrapper in settings.wrappers:
                timed = [
                    one_case(name, wrapper, mode, settings, rank, world, deadline)
                    for mode in settings.modes
                ]
                for row, trainer in timed:  # profiled only after every mode is timed
                    if trainer is not None:
                        profile_case(row, trainer, settings)
                    if rank == 0:
                        with open(results, "a") as f:
                            f.write(json.dumps(row) + "\n")
                timed = trainer = None  # freed before the next wrapper's modes
                release(settings)
    finally:
        dist.destroy_process_group()


def one_case(
    name: str, wrapper: str, mode: str, settings: Settings, rank: int, world: int, deadline: float
) -> tuple[dict, object]:
    """One case's row on this rank (an error or a skip is a row too), and its trainer where
    every rank timed it (to be profiled later); every rank agrees on skipping, and learns
    whether another rank failed."""
    label = f"{name} {wrapper} {mode}"
    go = [time.monotonic() < deadline]
    dist.broadcast_object_list(go, src=0)  # every rank takes the same decision
    if not go[0]:
        return {"model": name, "wrapper": wrapper, "mode": mode, "skipped": True}, None

    def say(text: str) -> None:
        if rank == 0:
            print(f"[bench_distributed] {label}: {text}", flush=True)

    say("building")
    trainer = None
    try:
        row, trainer = run_case(name, wrapper, mode, settings, rank, say)
    except Exception as exc:  # a failing mode is an error cell; the others still run
        row = {"model": name, "wrapper": wrapper, "mode": mode,
               "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
        lines = traceback.format_exc().splitlines()
        print(f"[bench_distributed] rank {rank} {label}:", *lines[-12:], sep="\n", flush=True)
    states: list = [None] * world
    dist.all_gather_object(states, (row.get("error"), trainer is not None))
    others = [f"rank {r}: {e}" for r, (e, _) in enumerate(states) if e and r != rank]
    if others:
        row["other_ranks"] = others
    if not all(timed for _, timed in states):  # the ranks profile together or not at all
        trainer = None
    return row, trainer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(settings: Settings, world: int) -> tuple[list[dict], str]:
    """Every case's row (rank 0's), and why the ranks stopped early ("" when they did not)."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-dist-") as folder:
        results = Path(folder) / "rows.jsonl"
        results.touch()
        stopped = ""
        try:
            mp.start_processes(
                worker,
                args=(world, free_port(), settings, str(results)),
                nprocs=world,
                join=True,
                start_method="spawn",
            )
        except Exception as exc:  # what finished still counts
            stopped = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        rows = [json.loads(line) for line in results.read_text().splitlines() if line]
    return rows, stopped


# --- the table ------------------------------------------------------------------------------


def ms(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def loss_cell(row: dict, eager: dict | None, bf16: bool) -> str:
    if row["mode"] == "eager" or not eager or not row.get("losses") or not eager.get("losses"):
        return "—"
    pairs = list(zip(row["losses"], eager["losses"], strict=False))
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs)
    verdict = "agrees" if worst <= AGREES[bf16] else "DIFFERS"
    return f"{worst:.1e} ({verdict}, {len(pairs)} steps)"


def table_row(row: dict, eager: dict | None, bf16: bool) -> list[str]:
    head = [row["model"], row["wrapper"], row["mode"]]
    if row.get("skipped"):
        return [*head, *["—"] * 9, "skipped: out of KILN_BENCH_BUDGET_S"]
    if "error" in row:
        return [*head, *["—"] * 9, f"error: {row['error'][:200]}"]
    step = row.get("step_ms")
    speedup = "—"
    if step and eager and eager.get("step_ms"):
        speedup = f"{eager['step_ms'] / step:.2f}x"
    prof = row.get("profile") or {}
    hidden = prof.get("hidden")
    notes = [row.get("note", "")]
    if step and row.get("mean_ms", 0) > 1.1 * step:
        notes.append(f"mean {row['mean_ms']:.2f} ms/step")
    if row.get("warnings"):
        notes.append(f"{len(row['warnings'])} warning(s), listed above")
    notes += row.get("other_ranks", [])
    return [*head, ms(step), speedup, ms(row.get("profiled_ms")),
            ms(prof.get("compute_ms")), ms(prof.get("comm_ms")),
            "—" if hidden is None else f"{hidden:.0%}", ms(prof.get("exposed_ms")),
            f"{row['ready_s']:.1f}", loss_cell(row, eager, bf16),
            "; ".join(n for n in notes if n)]  # fmt: skip


def markdown_table(rows: list[list[str]]) -> str:
    rule = ["---:" if i in RIGHT else "---" for i in range(len(HEADER))]
    return "\n".join("| " + " | ".join(line) + " |" for line in [HEADER, rule, *rows])


def report(settings: Settings, world: int, rows: list[dict], stopped: str) -> str:
    sizes = {r["model"]: r["parameters"] for r in rows if r.get("parameters")}
    backend = "NCCL" if settings.device == "cuda" else "gloo"
    lines = [
        f"- {world} ranks ({backend}, {settings.device}); " + ", ".join(environment()),
        "- models: " + ", ".join(f"{m} ({n / 1e6:.1f}M parameters)" for m, n in sizes.items()),
        f"- {settings.precision()}; SGD(lr=1e-3, momentum=0.9); {settings.batch}x{settings.seq} "
        f"tokens per rank; {settings.warmup} warm-up steps, {settings.steps} timed, "
        f"{settings.profile_steps} profiled (read on rank 0)",
    ]
    if settings.ignored:
        lines.append(f"- names that match nothing here (ignored): {', '.join(settings.ignored)}")
    if stopped:
        lines.append(f"- the ranks stopped early: {stopped}")
    for r in rows:
        for w in r.get("warnings", []):
            lines.append(f"- warning in {r['model']} {r['wrapper']} {r['mode']}: {w}")
    eager = {(r["model"], r["wrapper"]): r for r in rows if r["mode"] == "eager"}
    body = [table_row(r, eager.get((r["model"], r["wrapper"])), settings.bf16) for r in rows]
    return "\n".join(lines) + "\n\n" + markdown_table(body)


def main() -> str:
    settings = read_settings()
    if not (settings.models and settings.wrappers and settings.modes):
        return f"bench_distributed: nothing to run ({', '.join(settings.ignored)} match none)"
    if settings.device == "cuda":
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < 2:
            return (
                f"bench_distributed needs 2 CUDA GPUs (found {found}); "
                "KILN_BENCH_DEVICE=cpu runs it on the CPU with gloo"
            )
        world = min(2, found)
    else:
        world = 2
    started = time.perf_counter()
    rows, stopped = spawn(settings, world)
    print(f"[bench_distributed] done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return report(settings, world, rows, stopped)


if __name__ == "__main__":
    print(main())
