"""What a call costs on the GPU, read from ``torch.profiler``: device time, kernels, launches.

- **GPU-busy time**: the events the profiler reports on the device (``device_type`` CUDA:
  kernels, and memcpy/memset, told apart by the profiler's activity type or, where a torch
  has none, by their ``Memcpy``/``Memset`` names), as the union of their intervals (equal to
  the sum of their durations when nothing overlaps), over ``n`` calls divided by ``n``.
- **Kernels per call**: device kernel events over ``n`` calls divided by ``n`` (kernels run
  inside a CUDA graph count too: the profiler reports each).
- **Host launch calls per call**: the CUDA runtime/driver calls that launch work
  (``cudaLaunchKernel``, ``cuLaunchKernel``..., ``cudaGraphLaunch``, async memcpy/memset):
  with CUDA graphs replaying, a call makes one ``cudaGraphLaunch`` and (nearly) no kernel
  launches.

Not a benchmark itself (``gpu.py`` runs only ``bench_*.py``); the CPU-independent parts are
tested in ``integration/test_bench_helpers.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from timing import background_builds_finished
from torch.autograd import DeviceType

KERNEL_LAUNCHES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
    }
)
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
COPY_LAUNCHES = frozenset(
    {"cudaMemcpyAsync", "cudaMemsetAsync", "cuMemcpyAsync", "cuMemsetD8Async", "cuMemsetD32Async"}
)
_VERSION_SUFFIX = re.compile(r"_v\d+$")  # e.g. cudaLaunchKernel_v7000 in some CUPTI builds


@dataclass(frozen=True)
class DeviceEvent:
    name: str
    kind: str  # "kernel", "memcpy" or "memset"
    start_us: float
    end_us: float


def device_kind(name: str, activity_type: str | None) -> str:
    """``kernel``, ``memcpy`` or ``memset`` for an event on the device."""
    if activity_type in ("gpu_memcpy", "gpu_memset"):
        return activity_type[4:]
    if activity_type == "kernel":
        return "kernel"
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def device_events(events: Iterable, device_type: DeviceType = DeviceType.CUDA) -> list[DeviceEvent]:
    """The events of ``prof.events()`` that ran on ``device_type`` (CUDA: the GPU's)."""
    found = []
    for e in events:
        if e.device_type != device_type:
            continue
        kind = device_kind(e.name, getattr(e, "activity_type", None))
        found.append(DeviceEvent(e.name, kind, e.time_range.start, e.time_range.end))
    return found


def busy_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals: overlapping work counts once."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def host_call_name(name: str) -> str:
    return _VERSION_SUFFIX.sub("", name)


@dataclass(frozen=True)
class CallProfile:
    """Per-call figures from a profile of ``calls`` back-to-back calls."""

    calls: int
    busy_us: float  # GPU-busy time (kernels, memcpy, memset), per call
    kernel_us: float  # kernels alone, summed, per call
    kernels: float
    copies: float  # memcpy + memset events
    kernel_launch_calls: float  # host-side launch API calls of single kernels
    graph_launches: float
    copy_calls: float

    @property
    def host_launch_calls(self) -> float:
        return self.kernel_launch_calls + self.graph_launches + self.copy_calls


def summarize(
    events: Sequence, calls: int, device_type: DeviceType = DeviceType.CUDA
) -> CallProfile:
    """Per-call figures from the events of a profile of ``calls`` calls."""
    on_device = device_events(events, device_type)
    kernels = [e for e in on_device if e.kind == "kernel"]
    host = [host_call_name(e.name) for e in events if e.device_type == DeviceType.CPU]
    return CallProfile(
        calls=calls,
        busy_us=busy_us((e.start_us, e.end_us) for e in on_device) / calls,
        kernel_us=sum(e.end_us - e.start_us for e in kernels) / calls,
        kernels=len(kernels) / calls,
        copies=(len(on_device) - len(kernels)) / calls,
        kernel_launch_calls=sum(n in KERNEL_LAUNCHES for n in host) / calls,
        graph_launches=sum(n in GRAPH_LAUNCHES for n in host) / calls,
        copy_calls=sum(n in COPY_LAUNCHES for n in host) / calls,
    )


def profile_calls(fn: Callable[[], object], calls: int) -> CallProfile:
    """Profile ``calls`` back-to-back calls of ``fn`` on the GPU (CPU and CUDA activities).

    Time a process's calls before its first profile: after one, CUPTI stays attached to the
    process (torch keeps it there where CUDA graphs are in use: tearing it down crashes
    them) and every later CUDA call pays its callbacks; a BERT training step's host time
    on the H100's host grew 30-50 %."""
    from torch.profiler import ProfilerActivity, profile

    background_builds_finished()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return summarize(prof.events(), calls)


# --- are CUDA graphs replaying? ----------------------------------------------------------


def graphs_replaying(one_call: CallProfile) -> str | None:
    """None if the profile of a call shows a CUDA-graph launch, else why not engaged."""
    if one_call.graph_launches >= 1:
        return None
    return (
        f"no cudaGraphLaunch in a profiled call ({one_call.kernel_launch_calls:.0f} kernel "
        "launches instead)"
    )


def torch_cudagraph_skips() -> int:
    """How often inductor skipped CUDA graphs in this process (its reasons are logged with
    ``TORCH_LOGS=perf_hints``)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


def kiln_graph_counts() -> tuple[int, int, dict[str, int]] | None:
    """(replays, calls run without a graph, their reasons) of every kiln-cudagraphs wrapper of
    this process, or None without kiln-cudagraphs."""
    try:
        import kiln_cudagraphs
    except ImportError:
        return None
    totals = kiln_cudagraphs.stats()
    return totals.replays, totals.eager_calls, dict(totals.reasons)


def kiln_replay_delta(before, after) -> tuple[int, int, str]:
    """(replays, calls run without a graph, their reasons) between two
    :func:`kiln_graph_counts`."""
    if before is None or after is None:
        return 0, 0, "kiln_cudagraphs is not importable"
    replays, eager = after[0] - before[0], after[1] - before[1]
    reasons = "; ".join(
        f"{r} ({n - before[2].get(r, 0)}x)" for r, n in after[2].items() if n > before[2].get(r, 0)
    )
    return replays, eager, reasons
