"""Kernel time on a CUDA device, without the host's launches: what the rewrites that are
decided per shape (:mod:`kiln.sibling_products`, :mod:`kiln.patch_convolutions`) compare.

A few-microsecond kernel launched from Python is timed mostly as its launch; captured in a
CUDA graph and replayed, it is timed as the GPU runs it in a replayed graph of Kiln's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


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
