"""Kernel time on a CUDA device, without the host's launches, and the decisions taken from
it: what the rewrites that are decided per shape (:mod:`kiln.padding`,
:mod:`kiln.sibling_products`, :mod:`kiln.patch_convolutions`,
:mod:`kiln.convolution_epilogues`) compare.

A few-microsecond kernel launched from Python is timed mostly as its launch; captured in a
CUDA graph and replayed, it is timed as the GPU runs it in a replayed graph of Kiln's.

A decision is timed once per shape and machine: :func:`decided_once` keeps it for the
process and, while a compile runs :func:`decisions_in` a cache root, on disk under
``<root>/timings/`` (keyed by the shape, the device's name and the torch and cuDNN
versions), so a warm start times nothing. A decision that could not be timed (out of
memory, say) is not kept.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

# where decisions are kept on disk during a compile (None: in this process only)
_folder: contextvars.ContextVar[Path | None] = contextvars.ContextVar("timings", default=None)


def device_time(fn: Callable[[], object], repeats: int = 20) -> float:
    """Microseconds per call of ``fn``'s kernels, replayed from a CUDA graph of ``repeats``
    calls (after three calls outside the graph, which warm up libraries and allocations)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * repeats)


@contextlib.contextmanager
def decisions_in(root: Path | None) -> Iterator[None]:
    """Decisions taken inside are read from and kept under ``<root>/timings/`` (None:
    only in this process)."""
    token = _folder.set(None if root is None else Path(root) / "timings")
    try:
        yield
    finally:
        _folder.reset(token)


def decided_once(kind: str) -> Callable[[Callable[..., bool | None]], Callable[..., bool]]:
    """A decision of ``kind`` over hashable shape arguments (True, False, or None where it
    could not be timed), taken once per shape: kept in the process and on disk (see
    :func:`decisions_in`). ``decision.cache_clear()`` forgets the process's decisions."""

    def wrap(decide: Callable[..., bool | None]) -> Callable[..., bool]:
        memo: dict[tuple, bool] = {}

        @functools.wraps(decide)
        def decision(*shape) -> bool:
            if shape in memo:
                return memo[shape]
            path = _path(kind, shape)
            taken = _read(path)
            if taken is None:
                taken = decide(*shape)
                if taken is None:  # not timed: decided against, not kept
                    return False
                _write(path, kind, shape, taken)
            memo[shape] = taken
            return taken

        decision.cache_clear = memo.clear
        return decision

    return wrap


def _path(kind: str, shape: tuple) -> Path | None:
    folder = _folder.get()
    if folder is None:
        return None
    devices = [torch.cuda.get_device_name(d) for d in shape if isinstance(d, torch.device)
               and d.type == "cuda"]  # fmt: skip
    text = json.dumps([kind, repr(shape), devices, torch.__version__, _cudnn_version()])
    return folder / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"


def _cudnn_version() -> int | None:
    return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None


def _read(path: Path | None) -> bool | None:
    if path is None:
        return None
    try:
        taken = json.loads(path.read_text())["taken"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return taken if isinstance(taken, bool) else None


def _write(path: Path | None, kind: str, shape: tuple, taken: bool) -> None:
    if path is None:
        return
    with contextlib.suppress(OSError):  # not kept: timed again by the next process
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"kind": kind, "shape": repr(shape), "taken": taken}))
        tmp.replace(path)
