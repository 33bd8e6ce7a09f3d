"""One allocation per call: the buffers a host program allocates and frees within the call
placed at fixed byte offsets of one block (the arena), decided when the program is rendered.

A storage is a buffer the program allocates (a kernel's output, or the ``out=`` tensor an
extern op fills) with the buffers that later reuse it or are written in place over it. It
is live from the step that allocates it to the last step that reads or writes any of
those. Storages whose lives overlap get disjoint byte ranges (largest first, each at the
lowest offset that fits); the others may share one. Left out of the arena, and allocated
on their own as before: storages the graph's outputs live in (a user holds them after the
call), storages of symbolic size, those on another device than the arena's, and those an
ATen op reads that takes a storage offset (``as_strided_scatter``: the offset counts from
the start of its tensor's storage, and an arena buffer is a view past the arena's start).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from kiln_loopir.ir import Buffer, ExternNode
from kiln_loopir.kernel import Schedule
from kiln_loopir.memory import MemoryPlan
from kiln_loopir.scheduler import step_reads, step_writes

ALIGNMENT = 256  # bytes: what cuBLAS and vectorized kernels ask of a pointer


@dataclass
class Arena:
    """Where each arena buffer lives: ``offsets[name]`` bytes past the arena's start."""

    device: str | None = None
    size: int = 0
    offsets: dict[str, int] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.offsets

    def format(self) -> str:
        lines = [f"arena: {self.size} bytes on {self.device}"]
        lines += [f"  {name} at {offset}" for name, offset in sorted(self.offsets.items())]
        return "\n".join(lines)


@dataclass
class _Storage:
    root: str
    first: int
    last: int
    nbytes: int | None  # None: symbolic
    device: str
    members: list[str] = field(default_factory=list)


def plan_arena(
    schedule: Schedule, plan: MemoryPlan, kept: set[str], out_filled: dict[int, list[str]]
) -> Arena:
    """The arena of ``schedule``'s host program: ``kept`` are the buffers that outlive the
    call (inputs, outputs and what outputs are views of), ``out_filled`` the buffers each
    extern step (by index) writes into memory the program gives it (its ``out=`` overload,
    or a kernel computing it in the op's place)."""
    buffers = schedule.graph.buffers()
    storages = _storages(schedule, plan, buffers, out_filled)
    left_out = kept | _read_at_storage_offsets(schedule)
    placeable = [
        s
        for s in storages.values()
        if s.nbytes is not None and not left_out.intersection(s.members) and s.nbytes > 0
    ]
    if not placeable:
        return Arena()
    device = max({s.device for s in placeable}, key=lambda d: sum(x.device == d for x in placeable))
    placed: list[tuple[_Storage, int]] = []
    for s in sorted(placeable, key=lambda s: (-s.nbytes, s.first)):
        if s.device == device:
            placed.append((s, _lowest_free_offset(s, placed)))
    size = max(offset + _aligned(s.nbytes) for s, offset in placed)
    offsets = {name: offset for s, offset in placed for name in s.members}
    return Arena(device, size, offsets)


def _read_at_storage_offsets(schedule: Schedule) -> set[str]:
    """Buffers an extern step reads whose op takes a ``storage_offset`` argument."""
    found: set[str] = set()
    for step in schedule.steps:
        if isinstance(step, ExternNode) and _takes_storage_offset(step.target):
            found |= {ref.buffer for ref in step.input_refs()}
    return found


def _takes_storage_offset(op: object) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is not None and any(a.name == "storage_offset" for a in schema.arguments)


def _storages(
    schedule: Schedule,
    plan: MemoryPlan,
    buffers: dict[str, Buffer],
    out_filled: dict[int, list[str]],
) -> dict[str, _Storage]:
    root_of: dict[str, str] = {}
    storages: dict[str, _Storage] = {}

    def own(name: str, step: int) -> None:
        b = buffers[name]
        nbytes = sympy.sympify(b.nbytes())
        size = int(nbytes) if nbytes.is_Integer else None
        storages[name] = _Storage(name, step, step, size, str(b.device), [name])
        root_of[name] = name

    for i, (step, sp) in enumerate(zip(schedule.steps, plan.steps, strict=True)):
        for name in sp.allocate:
            own(name, i)
        for name in out_filled.get(i, ()):
            own(name, i)
        for new, old in {**sp.reuse, **sp.in_place}.items():
            root = root_of.get(old)
            if root is None:
                continue  # the storage of an extern op's own result: not the program's
            root_of[new] = root
            storages[root].members.append(new)
            new_bytes = sympy.sympify(buffers[new].nbytes())
            if storages[root].nbytes is not None and new_bytes.is_Integer:
                storages[root].nbytes = max(storages[root].nbytes, int(new_bytes))
            else:
                storages[root].nbytes = None
        for name in step_reads(step) | step_writes(step):
            if name in root_of:
                storages[root_of[name]].last = i
    return storages


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _lowest_free_offset(s: _Storage, placed: list[tuple[_Storage, int]]) -> int:
    """The lowest aligned offset where ``s`` overlaps no placed storage live with it."""
    busy = sorted(
        (offset, offset + _aligned(o.nbytes))
        for o, offset in placed
        if o.first <= s.last and s.first <= o.last
    )
    offset = 0
    for start, end in busy:
        if offset + _aligned(s.nbytes) <= start:
            break
        offset = max(offset, end)
    return offset
