"""Choosing a launch configuration by timing the candidates, and remembering the winner
on disk per (kernel source, sizes, device) so later processes skip the timing.

The cache lives in ``$KILN_TRITON_CACHE_DIR``, else ``<root>/triton`` (the root kiln sets
for a compile, else ``$KILN_CACHE_DIR``, else ``~/.cache/kiln``: see
:mod:`kiln_cpp.cache_dirs`, which also keeps it private to the user) under ``autotune/``;
``KILN_TRITON_AUTOTUNE=0`` turns timing off (the heuristic's first pick is used).
Kernels with little work are not timed: launch cost dominates them (:func:`worth_timing`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from kiln_cpp import cache_dirs
from kiln_triton.configs import Config

# kernels touching fewer points than this run the heuristic's pick untimed; pointwise
# kernels below MIN_POINTWISE_POINTS too (their block size matters little until they are
# big, and each timed candidate is compiled, loaded and launched 31 times at compile time)
MIN_POINTS = 1 << 18
MIN_POINTWISE_POINTS = 1 << 22
# how winners were timed, part of their key: a winner timed otherwise is timed again
TIMING = "replayed from a CUDA graph"


def cache_dir() -> Path:
    """The cache folder, created private; a temporary one where it is refused."""
    return cache_dirs.usable_folder("KILN_TRITON_CACHE_DIR", "triton", "kiln-triton")


def enabled() -> bool:
    return os.environ.get("KILN_TRITON_AUTOTUNE", "1") != "0"


def worth_timing(kind: str, points: int) -> bool:
    """Whether a kernel of ``kind`` over ``points`` is timed (else the heuristic's pick)."""
    least = MIN_POINTWISE_POINTS if kind == "pointwise" else MIN_POINTS
    return enabled() and points >= least


def cache_key(source_hash: str, numels: dict, sizes: tuple, device: str) -> str:
    import triton

    text = json.dumps(
        [source_hash, sorted(numels.items()), list(sizes), device, triton.__version__, TIMING]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def load_winner(key: str, folder: Path | None = None) -> Config | None:
    """The winner stored under ``key`` in ``folder`` (default: :func:`cache_dir`)."""
    path = (folder or cache_dir()) / "autotune" / f"{key}.json"
    try:
        return Config.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None


def save_winner(
    key: str, config: Config, timings: dict[str, float], folder: Path | None = None
) -> None:
    folder = (folder or cache_dir()) / "autotune"
    folder.mkdir(mode=0o700, exist_ok=True)
    tmp = folder / f"{key}.json.{os.getpid()}"
    tmp.write_text(json.dumps({**config.as_dict(), "timings_us": timings}, indent=1))
    tmp.replace(folder / f"{key}.json")


def time_config(launch: Callable[[], None], reps: int = 10) -> float:
    """Microseconds per launch on the device, median of three batches (after a warm-up
    launch): ``reps`` launches captured in a CUDA graph and replayed, as Kiln runs kernels
    (a kernel of a few microseconds launched from Python is timed mostly as its launch: a
    split reduction's two launches lost to one slower launch that way). Kiln's launches
    never synchronize with the host, so a graph holds them; where a capture still fails,
    they are timed as launched."""
    launch()
    torch.cuda.synchronize()
    batch = _captured(launch, reps)
    if batch is None:

        def batch() -> None:
            for _ in range(reps):
                launch()

    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        batch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[1]


def _captured(launch: Callable[[], None], reps: int) -> Callable[[], None] | None:
    """The replay of a CUDA graph of ``reps`` launches, or None where capture fails."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(reps):
                launch()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    return graph.replay


def pick(configs: list[Config], launch_with: Callable[[Config], Callable[[], None]]) -> tuple:
    """The fastest config and every config's time (microseconds)."""
    timings: dict[str, float] = {}
    best, best_t = configs[0], float("inf")
    for config in configs:
        try:
            t = time_config(launch_with(config))
        except Exception:  # a config that does not compile (too many registers ...) loses
            continue
        timings[json.dumps(config.as_dict(), sort_keys=True)] = round(t, 2)
        if t < best_t:
            best, best_t = config, t
    return best, timings
