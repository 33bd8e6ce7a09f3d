"""The scheduler: IR nodes -> kernels, fused, in an order that keeps live memory low."""

from __future__ import annotations

import heapq

import sympy

from kiln_loopir.fusion import output_buffers, reachable, score, try_fuse
from kiln_loopir.ir import ComputedNode, ExternNode, LoopGraph, TensorRef
from kiln_loopir.kernel import Kernel, Schedule, Step, kernel_of
from kiln_loopir.names import kernel_name
from kiln_loopir.symbols import data_dependent_symbols


def step_reads(step: Step) -> set[str]:
    if isinstance(step, Kernel):
        return step.reads()
    return {ref.buffer for ref in step.input_refs()}


def schedule_reads(schedule: Schedule) -> set[str]:
    """The buffers something reads: a step, or the caller (the graph's outputs)."""
    read = {name for step in schedule.steps for name in step_reads(step)}
    return read | {o.buffer for o in schedule.graph.outputs if isinstance(o, TensorRef)}


def step_writes(step: Step) -> set[str]:
    if isinstance(step, Kernel):
        return step.writes()
    return {b.name for b in step.outputs if b is not None}


def step_symbols_used(step: Step) -> set[sympy.Symbol]:
    """The data-dependent size symbols (``u0``: numbers read from tensor data) a step's
    loops, indices, buffer layouts or arguments mention, less those it defines itself."""
    if isinstance(step, Kernel):
        exprs: list[object] = [*step.ranges, *step.reduction_ranges, *step.symbols()]
        for node in step.nodes:
            exprs += [*node.buffer.size, *node.buffer.stride]
        return data_dependent_symbols(exprs)
    exprs = []
    for ref in step.input_refs():
        exprs += [*ref.size, *ref.stride, ref.offset]
    for buf in step.outputs:
        if buf is not None:
            exprs += [*buf.size, *buf.stride]
    exprs += _flat_exprs(step.args) + _flat_exprs(list(step.kwargs.values()))
    return data_dependent_symbols(exprs) - step.bound_symbols()


def _flat_exprs(value: object) -> list[object]:
    if isinstance(value, sympy.Basic):
        return [value]
    if isinstance(value, (list, tuple)):
        return [e for v in value for e in _flat_exprs(v)]
    return []


def _access(steps: list[Step]) -> tuple[list[set[str]], list[set[str]]]:
    """What each step reads and writes, for ordering: its buffers and (as ``$u0``) the
    data-dependent symbols it uses and binds (looked for only where some step binds one)."""
    reads = [step_reads(s) for s in steps]
    writes = [step_writes(s) for s in steps]
    bound = [s.bound_symbols() if isinstance(s, ExternNode) else set() for s in steps]
    if any(bound):
        for i, step in enumerate(steps):
            reads[i] |= {f"${s}" for s in step_symbols_used(step)}
            writes[i] |= {f"${s}" for s in bound[i]}
    return reads, writes


def dependencies(steps: list[Step]) -> dict[int, set[int]]:
    """For each step index, the indices of the steps it must follow."""
    last_writer: dict[str, int] = {}
    readers_since: dict[str, list[int]] = {}
    deps: dict[int, set[int]] = {}
    all_reads, all_writes = _access(steps)
    for i in range(len(steps)):
        d: set[int] = set()
        reads, writes = all_reads[i], all_writes[i]
        for name in reads:
            if name in last_writer:
                d.add(last_writer[name])
        for name in writes:
            if name in last_writer:  # a second write (scatter) follows the first's readers
                d.add(last_writer[name])
                d |= set(readers_since.get(name, []))
        for name in reads:
            readers_since.setdefault(name, []).append(i)
        for name in writes:
            last_writer[name] = i
            readers_since[name] = []
        d.discard(i)
        deps[i] = d
    return deps


def unfused_schedule(graph: LoopGraph) -> Schedule:
    """One kernel per computed node, extern nodes as they are, in program order."""
    steps: list[Step] = []
    count = 0
    for node in graph.nodes:
        if isinstance(node, ComputedNode):
            steps.append(kernel_of(node, kernel_name([node], count)))
            count += 1
        else:
            steps.append(node)
    schedule = Schedule(graph, steps)
    assign_locals(schedule)
    return schedule


def assign_locals(schedule: Schedule) -> None:
    """Mark as local each buffer that only its own kernel reads and nobody returns."""
    outputs = output_buffers(schedule.graph)
    readers: dict[str, int] = {}
    writers: dict[str, int] = {}
    for step in schedule.steps:
        for name in step_reads(step):
            readers[name] = readers.get(name, 0) + 1
        for name in step_writes(step):
            writers[name] = writers.get(name, 0) + 1
    for kernel in schedule.kernels():
        kernel.local_buffers = {
            name
            for name in kernel.writes()
            if name not in outputs and readers.get(name, 0) == 0 and writers[name] == 1
        }


def fuse_reference(schedule: Schedule) -> Schedule:
    """:func:`fuse` recomputed from scratch each round: slow, simple, for the tests."""
    steps = list(schedule.steps)
    graph = schedule.graph
    outputs = output_buffers(graph)
    count = len(schedule.kernels())
    nbytes = {name: graph.hint(buf.nbytes()) for name, buf in graph.buffers().items()}
    refused: set[tuple[Kernel, Kernel]] = set()  # pairs try_fuse said no to
    while True:
        reads = {id(s): step_reads(s) for s in steps}
        readers: dict[str, int] = {}
        for s in steps:
            for name in reads[id(s)]:
                readers[name] = readers.get(name, 0) + 1
        deps = dependencies(steps)
        candidates = []
        for i, j in sharing_pairs(steps, reads):
            a, b = steps[i], steps[j]
            if (a, b) in refused:
                continue
            saved = score(a, b, reads, readers, graph, outputs, nbytes)
            if saved > 0:
                candidates.append((-saved, i, j))
        merged = False
        for _, i, j in sorted(candidates):
            if reachable(deps, i, j, skip=[i]):
                continue
            fused = try_fuse(
                steps[i], steps[j], kernel_name(steps[i].nodes + steps[j].nodes, count)
            )
            if fused is None:
                refused.add((steps[i], steps[j]))
                continue
            count += 1
            # The fused kernel takes the earlier slot; a stable topological sort then moves
            # it after whatever the later kernel needed (no path runs between the two).
            steps[i] = fused
            del steps[j]
            steps = stable_topological_sort(steps)
            merged = True
            break
        if not merged:
            break
    fused_schedule = Schedule(graph, renamed(steps))
    assign_locals(fused_schedule)
    return fused_schedule


def sharing_pairs(steps: list[Step], reads: dict[int, set[str]]) -> set[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, of kernels where one reads what the other writes or
    both read one buffer: the only pairs whose merge can save memory traffic."""
    users: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        if isinstance(step, Kernel):
            for name in reads[id(step)] | step.writes():
                users.setdefault(name, []).append(i)
    pairs: set[tuple[int, int]] = set()
    for indices in users.values():
        for k, i in enumerate(indices):
            pairs.update((i, j) for j in indices[k + 1 :])
    return pairs


def stable_topological_sort(steps: list[Step]) -> list[Step]:
    """``steps`` in dependency order, each as early in the given order as it can be."""
    return [steps[i] for i in stable_order(dependencies_by_data(steps))]


def stable_order(deps: dict[int, set[int]]) -> list[int]:
    """The indices of ``deps`` (index -> the indices it depends on) in an order that puts
    each after its dependencies, the smallest index that is ready first."""
    waiting = {i: len(d) for i, d in deps.items()}
    followers: dict[int, list[int]] = {i: [] for i in deps}
    for i, d in deps.items():
        for j in d:
            followers[j].append(i)
    ready = [i for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    result: list[int] = []
    while ready:
        best = heapq.heappop(ready)
        result.append(best)
        for f in followers[best]:
            waiting[f] -= 1
            if waiting[f] == 0:
                heapq.heappush(ready, f)
    if len(result) != len(deps):
        raise RuntimeError("the steps' dependencies form a cycle")
    return result


def dependencies_by_data(steps: list[Step]) -> dict[int, set[int]]:
    """Dependencies from buffer names alone, whatever the current order of ``steps``."""
    writers: dict[str, list[int]] = {}
    reads, writes = _access(steps)
    for i in range(len(steps)):
        for name in writes[i]:
            writers.setdefault(name, []).append(i)
    deps: dict[int, set[int]] = {}
    for i in range(len(steps)):
        d: set[int] = set()
        for name in reads[i] | writes[i]:
            ws = writers.get(name, [])
            # the first writer of a buffer precedes every other user of it; a scatter (a
            # second writer) precedes the buffer's readers that are not themselves writers
            if ws and ws[0] != i:
                d.add(ws[0])
            if len(ws) > 1 and i not in ws:
                d |= set(ws[1:])
        deps[i] = d
    return deps


def renamed(steps: list[Step]) -> list[Step]:
    """Kernels named for their ops and numbered in program order (deterministic names in
    printed output; see :mod:`kiln_loopir.names`)."""
    count = 0
    for step in steps:
        if isinstance(step, Kernel):
            step.name = kernel_name(step.nodes, count)
            count += 1
    return steps


def order(schedule: Schedule) -> Schedule:
    """A dependency order that keeps live memory low.

    Greedy: among the steps whose dependencies have run, take the one that frees the most
    bytes net of what it allocates; ties keep program order.
    """
    steps = schedule.steps
    graph = schedule.graph
    buffers = graph.buffers()
    nbytes = {name: graph.hint(buf.nbytes()) for name, buf in buffers.items()}
    inputs = {i.buffer.name for i in graph.inputs if i.buffer is not None}
    deps = dependencies(steps)
    outputs = output_buffers(graph)
    remaining_readers: dict[str, int] = {}
    for s in steps:
        for name in step_reads(s):
            remaining_readers[name] = remaining_readers.get(name, 0) + 1
    waiting = {i: len(d) for i, d in deps.items()}  # dependencies not run yet
    followers: dict[int, list[int]] = {i: [] for i in deps}
    for i, d in deps.items():
        for j in d:
            followers[j].append(i)
    ready = {i for i, n in waiting.items() if n == 0}
    result: list[Step] = []
    while len(result) < len(steps):

        def net(i: int) -> int:
            s = steps[i]
            allocated = sum(
                nbytes[n]
                for n in step_writes(s)
                if not (isinstance(s, Kernel) and n in s.local_buffers)
            )
            freed = sum(
                nbytes[n]
                for n in step_reads(s)
                if remaining_readers.get(n) == 1
                and n not in outputs
                and n in buffers
                and n not in inputs
            )
            return allocated - freed

        best = min(ready, key=lambda i: (net(i), i))
        ready.remove(best)
        result.append(steps[best])
        for name in step_reads(steps[best]):
            remaining_readers[name] -= 1
        for f in followers[best]:
            waiting[f] -= 1
            if waiting[f] == 0:
                ready.add(f)
    return Schedule(graph, renamed(result))
