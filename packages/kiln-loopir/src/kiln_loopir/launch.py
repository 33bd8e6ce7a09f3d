"""Launch groups: consecutive kernels of a schedule started by one call.

A code generator that can chain its kernels in native code (kiln-cpp: one C++ function
that calls each kernel in turn) declares ``render_group(group)``; the host program then
makes one call per run of consecutive kernels instead of one per kernel. Extern ops end a
run: they are called from the host program between groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from kiln_loopir.kernel import Kernel, Schedule


@dataclass(eq=False)
class LaunchGroup:
    """Kernels run in order by one call: ``name(*args, *size_args)``."""

    name: str
    kernels: list[Kernel]
    args: list[str] = field(default_factory=list)  # buffers, in order of first use
    arg_dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    size_args: list[sympy.Symbol] = field(default_factory=list)

    def __post_init__(self) -> None:
        for kernel in self.kernels:
            for a in kernel.args:
                if a not in self.arg_dtypes:
                    self.args.append(a)
                    self.arg_dtypes[a] = kernel.arg_dtypes[a]
        symbols = {s for k in self.kernels for s in k.size_args}
        self.size_args = sorted(symbols, key=str)

    def header(self) -> str:
        return f"{self.name}: {', '.join(k.name for k in self.kernels)}"


def launch_groups(schedule: Schedule, min_kernels: int = 2) -> list[LaunchGroup]:
    """The runs of at least ``min_kernels`` consecutive kernels in ``schedule``, in order
    (kernel arguments must be set: :func:`kiln_loopir.kernel_launch_args`)."""
    runs: list[list[Kernel]] = [[]]
    for step in schedule.steps:
        if isinstance(step, Kernel):
            runs[-1].append(step)
        elif runs[-1]:
            runs.append([])
    runs = [run for run in runs if len(run) >= min_kernels]
    return [LaunchGroup(f"launch_group{i}", run) for i, run in enumerate(runs)]
