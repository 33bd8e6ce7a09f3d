"""Memory planning: when each buffer is allocated and freed, which freed buffer a new one
reuses, and which kernel writes in place over an input it is the last to read."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from kiln_loopir.fusion import output_buffers
from kiln_loopir.ir import Buffer
from kiln_loopir.kernel import Kernel, Schedule
from kiln_loopir.scheduler import step_reads


@dataclass
class StepPlan:
    """What the host program does around one step."""

    allocate: list[str] = field(default_factory=list)  # fresh buffers
    reuse: dict[str, str] = field(default_factory=dict)  # new buffer -> freed buffer it takes
    in_place: dict[str, str] = field(default_factory=dict)  # new buffer -> input it overwrites
    free: list[str] = field(default_factory=list)  # dead after the step


@dataclass
class MemoryPlan:
    """The plan for a whole schedule, with its peak memory at the example sizes."""

    steps: list[StepPlan]
    peak_bytes: int
    naive_peak_bytes: int  # every buffer allocated fresh and kept to the end

    def format(self, schedule: Schedule) -> str:
        lines = [f"peak {self.peak_bytes} bytes (without planning {self.naive_peak_bytes})"]
        for step, plan in zip(schedule.steps, self.steps, strict=True):
            name = step.name if isinstance(step, Kernel) else f"extern {step.target_name()}"
            parts = [f"alloc {', '.join(plan.allocate)}"] if plan.allocate else []
            parts += [f"{new} reuses {old}" for new, old in plan.reuse.items()]
            parts += [f"{new} in place of {old}" for new, old in plan.in_place.items()]
            parts += [f"free {', '.join(plan.free)}"] if plan.free else []
            lines.append(f"{name}: " + "; ".join(parts))
        return "\n".join(lines)


def _same_storage(a: Buffer, b: Buffer) -> bool:
    if a.device != b.device or a.dtype != b.dtype:
        return False
    n, m = a.storage_numel(), b.storage_numel()
    if n.is_Integer and m.is_Integer:
        return n == m
    return sympy.expand(n - m) == 0


def _in_place_ok(kernel: Kernel, new: str, old: str) -> bool:
    """Whether ``kernel`` reads ``old`` only where it writes ``new`` (same point), only
    before it stores ``new``, and stores ``new`` after its last reduction, once per
    reduction's element where it has reductions.

    A reduction kernel runs as loops over the reduction range; what comes after a
    reduction runs in a later loop, which computes again the values it needs, loads
    included. A store of ``new`` before a reduction would be read back there in place of
    ``old``. A code generator may also split a reduction's range among programs that each
    finish their own part (kiln-triton's split reductions): a value stored once per output
    (a batch norm's statistics) is stored by one of them while the others may still read
    ``old`` (these buffers are small: nothing is lost by giving them their own)."""
    traced = kernel.traced()
    if kernel.reduction_ranges and not any(
        s.name.startswith("r") for s in traced.stores[new].free_symbols
    ):
        return False
    events = traced.handler.events
    loads = [load for load in traced.handler.loads if load.buffer == old]
    if not loads or ("store", new) not in events:
        return False
    first_store = events.index(("store", new))
    later = events[first_store:]
    if ("load", old) in later or any(kind == "reduction" for kind, _ in later):
        return False
    return all(
        not load.masked and sympy.expand(load.index - traced.stores[new]) == 0 for load in loads
    )


def plan_memory(schedule: Schedule, *, reuse: bool = True) -> MemoryPlan:
    """Plan allocation, reuse, in-place writes and frees for ``schedule``'s steps.

    Kernel outputs are allocated by the host program; a freed buffer of the same dtype,
    device and storage size is reused, and a kernel that is the last reader of such an
    input, reading it only at the points it writes, writes over it in place. Extern ops
    allocate their own results. A buffer is freed after its last reader; graph inputs and
    outputs (and buffers outputs are views of) are never freed.
    """
    graph = schedule.graph
    buffers = graph.buffers()
    inputs = {i.buffer.name for i in graph.inputs if i.buffer is not None}
    keep = output_buffers(graph) | inputs
    last_use: dict[str, int] = {}
    for i, step in enumerate(schedule.steps):
        for name in step_reads(step) | set(_stored(step)):
            last_use[name] = i
    # storage identity: a buffer that reuses another lives in the other's storage
    storage_of: dict[str, str] = {}
    pool: list[str] = []
    plans: list[StepPlan] = []
    live: dict[str, int] = {}
    naive = 0

    def nbytes(name: str) -> int:
        return graph.hint(buffers[name].nbytes())

    for i, step in enumerate(schedule.steps):
        plan = StepPlan()
        new = _stored(step)
        for name in new:
            if name in storage_of:  # a second write (scatter) into a live buffer
                continue
            naive += nbytes(name)
            if not isinstance(step, Kernel):
                storage_of[name] = name
                live[name] = nbytes(name)
                continue
            donor = None
            if reuse:
                for old in sorted(step_reads(step)):
                    if (
                        old not in keep
                        and last_use.get(old) == i
                        and old in storage_of
                        and storage_of[old] in live
                        and _same_storage(buffers[old], buffers[name])
                        and old not in plan.in_place.values()
                        and _in_place_ok(step, name, old)
                        and not _shares_storage_with_kept(old, storage_of, keep)
                    ):
                        donor = old
                        break
            if donor is not None:
                plan.in_place[name] = donor
                storage_of[name] = storage_of[donor]
                continue
            taken = next((old for old in pool if _same_storage(buffers[old], buffers[name])), None)
            if reuse and taken is not None:
                pool.remove(taken)
                plan.reuse[name] = taken
                storage_of[name] = storage_of[taken]
                live[storage_of[name]] = nbytes(name)
            else:
                plan.allocate.append(name)
                storage_of[name] = name
                live[name] = nbytes(name)
        for name in sorted(step_reads(step) | set(new)):
            if name in keep or last_use.get(name) != i or name not in storage_of:
                continue
            if name in plan.in_place.values():
                continue
            if _shares_storage_with_kept(name, storage_of, keep) or _storage_in_use(
                name, storage_of, last_use, i
            ):
                continue
            plan.free.append(name)
            if reuse:
                pool.append(name)
            live.pop(storage_of[name], None)
        plans.append(plan)
    return MemoryPlan(plans, _peak(schedule, plans, nbytes), naive)


def _peak(schedule: Schedule, plans: list[StepPlan], nbytes) -> int:
    """Peak bytes the host program holds: a freed buffer that a later step reuses stays
    held (by its name) until then."""
    reused = {old for plan in plans for old in plan.reuse.values()}
    root: dict[str, str] = {}
    live: dict[str, int] = {}
    peak = 0
    for step, plan in zip(schedule.steps, plans, strict=True):
        for name in _stored(step):
            if name in root:
                continue
            if name in plan.reuse:
                root[name] = root[plan.reuse[name]]
            elif name in plan.in_place:
                root[name] = root[plan.in_place[name]]
            else:
                root[name] = name
                live[name] = nbytes(name)
        peak = max(peak, sum(live.values()))
        for name in plan.free:
            if name not in reused:
                live.pop(root[name], None)
    return peak


def _stored(step) -> list[str]:
    """The buffers ``step`` writes to memory, in its order (a kernel's nodes, an extern
    op's outputs): the plan and the host program it gives do not depend on string hashes."""
    if isinstance(step, Kernel):
        return step.stored_buffers()
    return list(dict.fromkeys(b.name for b in step.outputs if b is not None))


def _shares_storage_with_kept(name, storage_of, keep) -> bool:
    root = storage_of.get(name)
    return any(storage_of.get(k) == root for k in keep if k in storage_of)


def _storage_in_use(name, storage_of, last_use, i) -> bool:
    root = storage_of[name]
    return any(
        other != name and storage_of.get(other) == root and last_use.get(other, -1) > i
        for other in storage_of
    )
