"""One (model, size, phase) of ``bench_gpu_calls``, in a process of its own: every mode built
and checked against eager, timed taking turns, and only then checked for CUDA graphs
replaying and profiled (a profiler slows the rest of its process: ``gpu_timing``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F
from gpu_models import build, describe_inputs
from gpu_timing import (
    graphs_replaying,
    kiln_graph_counts,
    kiln_replay_delta,
    profile_calls,
    torch_cudagraph_skips,
)
from kiln_checks import compile_checked
from timing import take_turns

REPEATS = int(os.environ.get("KILN_BENCH_REPEATS", "7"))
MODES = ("eager", "torch.compile", "torch.compile reduce-overhead",
         "kiln launches", "kiln", "kiln reduce-overhead",
         "kiln direct-gradients", "kiln reduce-overhead direct-gradients")  # fmt: skip
KILN_OPTIONS = {
    "kiln launches": {"cudagraphs": False},  # kernel by kernel, no CUDA graph
    # the backward writes .grad itself (kiln_autograd.direct_gradients): training only
    "kiln direct-gradients": {"direct_gradients": True},
    "kiln reduce-overhead direct-gradients": {"direct_gradients": True},
}
TRAINING_ONLY = ("kiln direct-gradients", "kiln reduce-overhead direct-gradients")
WARMUP_CALLS = 4  # CUDA-graph modes: warm-up, record, first replays


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


class Case:
    """A model, its inputs and a phase; ``step(fn)`` is one call of ``fn`` in that phase."""

    def __init__(self, name: str, size: str, phase: str) -> None:
        self.model, self.inputs = build(name, size)
        self.phase = phase
        self.model.train(phase == "training")
        # gradients are cleared as a training loop clears them, through its optimizer (a
        # list of the parameters); ``model.zero_grad()`` walks the module tree at every
        # step (about 1 ms of host time for BERT on the H100's host, for every mode alike)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def step(self, fn: Callable) -> torch.Tensor:
        if self.phase == "inference":
            with torch.no_grad():
                return fn(*self.inputs)
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_of(fn(*self.inputs))
        loss.backward()
        return loss

    def result(self, fn: Callable) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output or loss, every parameter's gradient in one vector) of one step."""
        out = self.step(fn).detach().float()
        if self.phase == "inference":
            return out, None
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
            for p in self.model.parameters()
        ]
        return out, torch.cat(grads)


def compare(what: str, got: torch.Tensor, want: torch.Tensor) -> str:
    """bf16 tolerances: the largest difference within 5 % of the largest value (+0.05) and a
    cosine similarity of at least 0.99."""
    got, want = got.flatten(), want.flatten()
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    cos = F.cosine_similarity(got, want, dim=0).item() if want.numel() > 1 else 1.0
    if not err <= 0.05 * scale + 0.05 or not cos >= 0.99:
        raise AssertionError(f"{what} differs from eager: max diff {err:.3g} (of {scale:.3g})")
    return f"{what} max diff {err:.2g}"


def check(case: Case, fn: Callable, reference) -> str:
    out, grads = case.result(fn)
    notes = [compare("loss" if grads is not None else "output", out, reference[0])]
    if grads is not None:
        notes.append(compare("grads", grads, reference[1]))
    return ", ".join(notes)


def build_mode(case: Case, mode: str) -> tuple[Callable, str]:
    """The callable of ``mode``, warmed up, and a note; raises where it cannot run."""
    if mode == "eager":
        return case.model, ""
    if mode.startswith("torch.compile"):
        fn = torch.compile(case.model, mode="reduce-overhead" if "reduce" in mode else None)
        for _ in range(WARMUP_CALLS):
            case.step(fn)
        return fn, ""
    fn, compiled = compile_checked(
        case.model,
        case.step,
        mode="reduce-overhead" if "reduce" in mode else None,
        options=KILN_OPTIONS.get(mode),
    )
    for _ in range(WARMUP_CALLS - 2):  # compile_checked made two calls
        case.step(fn)
    return fn, f"kiln: {compiled.describe()}"


def engaged(case: Case, mode: str, fn: Callable) -> tuple[bool, str]:
    """(numbers may be reported, a note) for a CUDA-graph mode."""
    before = kiln_graph_counts()
    one = profile_calls(lambda: case.step(fn), 1)
    case.step(fn)
    why = graphs_replaying(one)
    if mode.startswith("torch.compile"):
        if why is None:
            return True, f"CUDA graphs replaying ({one.graph_launches:.0f} launch(es)/call)"
        return False, (
            f"not engaged: {why}; inductor skipped CUDA graphs {torch_cudagraph_skips()} "
            "time(s) in this process (TORCH_LOGS=perf_hints says why)"
        )
    replays, eager_calls, reasons = kiln_replay_delta(before, kiln_graph_counts())
    if replays == 0:
        counted = reasons or "kiln-cudagraphs counted no call"
        return False, f"not engaged: {why or 'no replay counted'}; {counted}"
    if eager_calls:
        return True, f"partly engaged: {replays} replays, {eager_calls} eager calls: {reasons}"
    return True, (
        f"CUDA graphs replaying ({replays / 2:.0f} replay(s) and "
        f"{one.graph_launches:.0f} cudaGraphLaunch per call)"
    )


def run_case(name: str, size: str, phase: str, emit: Callable[[dict], None]) -> None:
    """Every mode of one case; ``emit(row)`` for each (a dict, JSON-serialisable)."""
    try:
        case = Case(name, size, phase)
    except ImportError as exc:
        note = f"skipped: {exc.name or exc} is not installed"
        print(f"bench_gpu_calls: {name} {note}", file=sys.stderr)
        emit({"model": name, "input": size, "phase": phase, "mode": "all", "note": note})
        return
    head = {"model": name, "input": f"{size} {describe_inputs(case.inputs)}", "phase": phase}
    reference = case.result(case.model)
    ready: dict[str, Callable] = {}
    notes: dict[str, str] = {}
    modes = [m for m in MODES if phase == "training" or m not in TRAINING_ONLY]
    for mode in modes:  # built and checked: no profiler yet (see gpu_timing.profile_calls)
        try:
            started = time.perf_counter()
            fn, note = build_mode(case, mode)
            if mode != "eager":
                note += f"{'; ' if note else ''}ready in {time.perf_counter() - started:.0f} s"
            checked = check(case, fn, reference) if mode != "eager" else ""
            notes[mode] = "; ".join(filter(None, [note, checked]))
            ready[mode] = fn
        except Exception as exc:  # a mode that fails is a row, the others still run
            notes[mode] = f"error: {type(exc).__name__}: {exc}"
    before = kiln_graph_counts()
    walls = take_turns(
        {mode: (lambda fn=fn: case.step(fn)) for mode, fn in ready.items()},
        repeats=REPEATS,
        target_s=0.05,
        most_calls=200,
        sync=torch.cuda.synchronize,
    )
    _, eager_calls, _ = kiln_replay_delta(before, kiln_graph_counts())
    if "kiln reduce-overhead" in ready and eager_calls:
        notes["kiln reduce-overhead"] += f"; while timed: {eager_calls} calls without a graph"
    for mode in modes:  # profiled only now: every wall time above ran without CUPTI
        row = {**head, "mode": mode, "note": notes[mode]}
        if mode in ready:
            fn = ready[mode]
            ok = True
            if mode.startswith(("torch.compile reduce", "kiln")) and mode != "kiln launches":
                ok, graphs = engaged(case, mode, fn)
                ok = ok or "reduce-overhead" not in mode  # the default mode: big graphs only
                row["note"] = ", ".join(filter(None, [row["note"], graphs]))
            if ok:
                wall = walls[mode]
                row["wall_us"] = wall * 1e6
                calls = max(3, min(20, int(0.2 / max(wall, 1e-6))))
                try:
                    profile = profile_calls(lambda fn=fn: case.step(fn), calls)
                except Exception as exc:  # the wall time still stands
                    row["note"] += f"; profiler failed: {type(exc).__name__}: {exc}"
                else:
                    row["profile"] = {
                        **asdict(profile),
                        "host_launch_calls": profile.host_launch_calls,
                    }
        emit(row)
