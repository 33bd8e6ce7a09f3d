"""How much of a distributed step's communication the GPU hides under compute, read from the
kernel intervals of a ``torch.profiler`` trace.

- **communication**: device kernels whose name contains ``nccl`` (all-reduce, all-gather,
  reduce-scatter, broadcast ...), as the union of their intervals. An NCCL kernel starts
  when it is launched and ends when the transfer is done, so its time includes waiting for
  the other ranks: it is the time communication occupies, not the bytes over bandwidth.
- **compute**: every other device kernel (memcpy and memset are neither), as the union of
  their intervals: the GPU-busy time of compute kernels.
- **hidden**: the length of the intersection of the two unions. Kernels of one stream do
  not overlap in time, so communication can only be hidden by kernels of other streams;
  the share is hidden / communication, and what is left (communication - hidden) is the
  exposed communication the step waits for.

Not a benchmark itself (``gpu.py`` runs only ``bench_*.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_timing import DeviceEvent

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time as ``intervals``."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(merged: Sequence[Interval]) -> float:
    return sum(end - start for start, end in merged)


def intersection_length(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the time covered by both ``a`` and ``b`` (each sorted and disjoint)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, end - start)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_communication(name: str) -> bool:
    return "nccl" in name.lower()


@dataclass(frozen=True)
class Overlap:
    """Per-step figures, in µs, from a profile of ``steps`` steps."""

    steps: int
    compute_us: float  # union of compute kernels
    comm_us: float  # union of communication kernels
    hidden_us: float  # communication overlapping compute
    comm_kernels: float  # communication kernels per step

    @property
    def exposed_us(self) -> float:
        return self.comm_us - self.hidden_us

    @property
    def hidden_share(self) -> float | None:
        return self.hidden_us / self.comm_us if self.comm_us > 0 else None


def overlap(events: Iterable[DeviceEvent], steps: int) -> Overlap:
    """The figures of :class:`Overlap` from device events (``gpu_timing.device_events``)."""
    kernels = [e for e in events if e.kind == "kernel"]
    comm = union((e.start_us, e.end_us) for e in kernels if is_communication(e.name))
    compute = union((e.start_us, e.end_us) for e in kernels if not is_communication(e.name))
    return Overlap(
        steps=steps,
        compute_us=length(compute) / steps,
        comm_us=length(comm) / steps,
        hidden_us=intersection_length(comm, compute) / steps,
        comm_kernels=sum(is_communication(e.name) for e in kernels) / steps,
    )
