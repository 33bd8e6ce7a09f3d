"""Host-side timing shared by the benchmarks: variants take turns, medians, markdown tables.

Not a benchmark itself (``bench.py`` and ``gpu.py`` run only ``bench_*.py``).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence


def _nothing() -> None:
    return None


def background_builds_finished() -> None:
    """Wait for what Kiln builds in the background after a first call (kiln-triton's
    native host programs: the Python host program runs the calls meanwhile), so that a
    timing is of the program a long-running job runs."""
    triton = sys.modules.get("kiln_triton")
    if triton is not None:
        triton.wait_for_host_builds()


def calls_per_timing(
    fn: Callable[[], object], target_s: float, most: int, sync: Callable[[], None] = _nothing
) -> int:
    """How many back-to-back calls of ``fn`` take about ``target_s`` (1 to ``most``)."""
    sync()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    sync()
    once = max((time.perf_counter() - start) / 3, 1e-7)
    return max(1, min(most, int(target_s / once)))


def take_turns(
    variants: dict[str, Callable[[], object]],
    *,
    repeats: int = 15,
    target_s: float = 0.02,
    most_calls: int = 20_000,
    sync: Callable[[], None] = _nothing,
) -> dict[str, float]:
    """Median seconds per call of each variant (a callable taking no arguments).

    Every repeat times each variant once, in turn, so a busy machine slows them alike; a
    timing is ``n`` back-to-back calls (about ``target_s``) between two ``sync()`` calls
    (``torch.cuda.synchronize`` on a GPU), divided by ``n``. The garbage collector is
    paused while timing, as ``timeit`` does.
    """
    background_builds_finished()
    calls = {
        name: calls_per_timing(fn, target_s, most_calls, sync) for name, fn in variants.items()
    }
    background_builds_finished()  # begun by the first calls just made
    samples: dict[str, list[float]] = {name: [] for name in variants}
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for name, fn in variants.items():
                n = calls[name]
                sync()
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                sync()
                samples[name].append((time.perf_counter() - start) / n)
    finally:
        gc.enable()
    return {name: statistics.median(s) for name, s in samples.items()}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], numeric: int) -> str:
    """A markdown table; the ``numeric`` columns after the first are right-aligned."""
    rule = ["---"] + ["---:"] * numeric + ["---"] * (len(header) - 1 - numeric)
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def thread_counts() -> list[int]:
    """The CPU thread counts to measure: ``$KILN_BENCH_THREADS`` (comma-separated), else one
    thread and every core."""
    given = os.environ.get("KILN_BENCH_THREADS", "")
    if given:
        return [int(t) for t in given.split(",") if t.strip()]
    return sorted({1, os.cpu_count() or 1})
