"""The scheduler: IR nodes -> kernels, fused, in an order that keeps live memory low."""

from __future__ import annotations

import heapq

import sympy

from kiln_loopir.fusion import output_buffers, reachable, score, try_fuse
from kiln_loopir.ir import ComputedNode, ExternNode, LoopGraph
from kiln_loopir.kernel import Kernel, Schedule, Step, kernel_of
from kiln_loopir.names import kernel_name
from kiln_loopir.symbols import data_dependent_symbols


def step_reads(step: Step) -> set[str]:
    if isinstance(step, Kernel):
        return step.reads()
    return {ref.buffer for ref in step.input_refs()}


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


def fuse(schedule: Schedule) -> Schedule:
    """Merge kernels greedily, best score first, until no legal pair saves memory traffic.

    Each round takes the best-scoring pair (ties: the earliest first kernel, then the
    earliest second) that no third step's dependencies join and that :func:`try_fuse`
    accepts; the fused kernel takes the earlier slot and a stable topological sort moves it
    after whatever the later kernel needed. The bookkeeping is incremental (see
    :class:`_Fuser`); :func:`fuse_reference` is the same greedy loop recomputed from scratch
    each round, which the tests compare it with.
    """
    fuser = _Fuser(schedule)
    fuser.run()
    fused_schedule = Schedule(schedule.graph, _renamed(fuser.steps))
    assign_locals(fused_schedule)
    return fused_schedule


class _Fuser:
    """The state of :func:`fuse` between rounds.

    Per step: what it reads and writes (cached), an order label (its position's rank; a
    fusion only permutes the steps between the two kernels, which swap labels among
    themselves), its dependencies and followers. Per kernel pair sharing a buffer: its
    score, in a heap keyed ``(-score, label, label)``, the original loop's sort order.
    After a fusion only the pairs of the fused kernel, of the steps it moved and of the
    writers of buffers whose reader count changed are scored again.

    Dependencies are by data (the writer of each buffer read) when every buffer has one
    writer and no step binds a data-dependent size; otherwise (scatters, ``.item()``) they
    depend on the order, and each round recomputes them and sorts every step again.
    """

    def __init__(self, schedule: Schedule) -> None:
        graph = schedule.graph
        self.graph = graph
        self.steps = list(schedule.steps)
        self.outputs = output_buffers(graph)
        self.nbytes = {name: graph.hint(buf.nbytes()) for name, buf in graph.buffers().items()}
        self.count = len(schedule.kernels())
        self.reads: dict[int, set[str]] = {}  # keyed by id(step), as score() takes them
        self.writes: dict[Step, frozenset[str]] = {}
        self.readers: dict[str, int] = {}
        self.users: dict[str, dict[Kernel, None]] = {}  # buffer -> kernels using it
        self.touch: dict[str, dict[Step, None]] = {}  # buffer -> steps using it
        for step in self.steps:
            self._add(step)
        self.by_data = not any(isinstance(s, ExternNode) and s.bound_symbols() for s in self.steps)
        writers: dict[str, int] = {}
        for step in self.steps:
            for name in self.writes[step]:
                writers[name] = writers.get(name, 0) + 1
        # buffers written twice (scatters): their dependencies follow the order
        self.rewritten = {name for name, n in writers.items() if n > 1}
        self.refused: set[tuple[Kernel, Kernel]] = set()  # pairs try_fuse said no to
        self.heap: list[tuple[int, int, int, int, Kernel, Kernel]] = []
        self.version: dict[tuple[Kernel, Kernel], int] = {}
        self.serial = 0
        self._reset()

    def _add(self, step: Step) -> None:
        self.reads[id(step)] = step_reads(step)
        self.writes[step] = frozenset(step_writes(step))
        for name in self.reads[id(step)]:
            self.readers[name] = self.readers.get(name, 0) + 1
        for name in self.reads[id(step)] | self.writes[step]:
            self.touch.setdefault(name, {})[step] = None
            if isinstance(step, Kernel):
                self.users.setdefault(name, {})[step] = None

    def _remove(self, step: Step) -> None:
        for name in self.reads[id(step)]:
            self.readers[name] -= 1
        for name in self.reads[id(step)] | self.writes[step]:
            self.users.get(name, {}).pop(step, None)
            self.touch[name].pop(step)
        del self.reads[id(step)], self.writes[step], self.label[step]

    def _reset(self) -> None:
        """Labels, dependencies and every pair's score from the current order."""
        self.label = {s: k for k, s in enumerate(self.steps)}
        self._dependencies()
        self.heap = []
        self.version = {}
        self._rescore(self.steps)

    def _dependencies(self) -> None:
        if self.by_data:
            writer = {n: s for s in self.steps for n in self.writes[s] if n not in self.rewritten}
            self.deps = {
                s: {writer[n] for n in self.reads[id(s)] if n in writer} - {s} for s in self.steps
            }
            self._ordered_dependencies()
        else:
            by_index = dependencies(self.steps)
            self.deps = {s: {self.steps[k] for k in by_index[i]} for i, s in enumerate(self.steps)}
        self.followers: dict[Step, set[Step]] = {s: set() for s in self.steps}
        for s, d in self.deps.items():
            for t in d:
                self.followers[t].add(s)

    def _ordered_dependencies(self) -> None:
        """The dependencies through buffers written twice, as :func:`dependencies` finds
        them in the current order (``order_deps``), and as :func:`dependencies_by_data`
        does (``data_deps``, what the sort keeps)."""
        self.order_deps: dict[Step, set[Step]] = {}
        self.data_deps: dict[Step, set[Step]] = {}
        for name in self.rewritten:
            users = sorted(self.touch.get(name, ()), key=self.label.__getitem__)
            last_writer = None
            readers_since: list[Step] = []
            for s in users:
                d = self.order_deps.setdefault(s, set())
                if last_writer is not None and last_writer is not s:
                    d.add(last_writer)
                    if name in self.writes[s]:
                        d.update(r for r in readers_since if r is not s)
                if name in self.reads[id(s)]:
                    readers_since.append(s)
                if name in self.writes[s]:
                    last_writer = s
                    readers_since = []
            ws = [s for s in users if name in self.writes[s]]
            for s in users:
                d = self.data_deps.setdefault(s, set())
                if ws and ws[0] is not s:
                    d.add(ws[0])
                if s not in ws:
                    d.update(ws[1:])

    def _rescore(self, dirty) -> None:
        """Score again every pair of kernels sharing a buffer with a step of ``dirty``."""
        pairs: set[tuple[Kernel, Kernel]] = set()
        label = self.label
        for s in dirty:
            if not isinstance(s, Kernel):
                continue
            for name in self.reads[id(s)] | self.writes[s]:
                for t in self.users.get(name, ()):
                    if t is not s:
                        pairs.add((s, t) if label[s] < label[t] else (t, s))
        for a, b in pairs:
            saved = score(a, b, self.reads, self.readers, self.graph, self.outputs, self.nbytes)
            if saved > 0:
                self.serial += 1
                self.version[(a, b)] = self.serial
                heapq.heappush(self.heap, (-saved, label[a], label[b], self.serial, a, b))
            else:
                self.version.pop((a, b), None)

    def _joined(self, a: Kernel, b: Kernel) -> bool:
        """Whether ``b`` depends on ``a`` through a third step (a fusion would form a
        cycle). Steps before ``a`` cannot depend on it, so the search stops there."""
        start = self.label[a]
        order_deps = self.order_deps if self.by_data else {}
        label = self.label
        stack = [d for d in self.deps[b] | order_deps.get(b, set()) if d is not a]
        seen: set[Step] = set()
        while stack:
            s = stack.pop()
            if s is a:
                return True
            if s in seen or label[s] < start:
                continue
            seen.add(s)
            stack.extend(self.deps[s])
            stack.extend(order_deps.get(s, ()))
        return False

    def run(self) -> None:
        while self._round():
            pass

    def _round(self) -> bool:
        """Fuse the best legal pair; False when none is left."""
        held = []  # candidates a third step joins now: maybe not after a later fusion
        fused = None
        while self.heap:
            entry = heapq.heappop(self.heap)
            _, la, lb, serial, a, b = entry
            if (
                self.version.get((a, b)) != serial
                or self.label.get(a) != la
                or self.label.get(b) != lb
                or (a, b) in self.refused
            ):
                continue  # stale
            if self._joined(a, b):
                held.append(entry)
                continue
            fused = try_fuse(a, b, kernel_name(a.nodes + b.nodes, self.count))
            if fused is None:
                self.refused.add((a, b))
                continue
            held.append(entry)  # stale once a and b are gone
            break
        for entry in held:
            heapq.heappush(self.heap, entry)
        if fused is None:
            return False
        self.count += 1
        self._merge(a, b, fused)
        return True

    def _merge(self, a: Kernel, b: Kernel, fused: Kernel) -> None:
        steps = self.steps
        i, j = steps.index(a), steps.index(b)
        old_readers = {n: self.readers[n] for n in self.reads[id(a)] | self.reads[id(b)]}
        labels = [self.label[s] for s in steps[i:j]]
        # a buffer written twice (a scatter) that the pair touches: the fused kernel's
        # dependencies through it follow the order, found again from scratch this round
        scattered = self.reads[id(a)] | self.reads[id(b)] | self.writes[a] | self.writes[b]
        scattered &= self.rewritten
        self._remove(a)
        self._remove(b)
        self._add(fused)
        if not self.by_data or scattered:
            steps[i] = fused
            del steps[j]
            self.steps = stable_topological_sort(steps)
            self._reset()
            return
        # dependencies by data: the fused kernel's are its parts', its followers theirs
        deps = (self.deps.pop(a) | self.deps.pop(b)) - {a, b}
        self.deps[fused] = deps
        followers = (self.followers.pop(a) | self.followers.pop(b)) - {a, b}
        self.followers[fused] = followers
        for d in deps:
            self.followers[d] -= {a, b}
            self.followers[d].add(fused)
        for f in followers:
            self.deps[f] -= {a, b}
            self.deps[f].add(fused)
        # the stable topological sort moves only steps between a and b: every step before
        # a is ready before them, every step after b waits for none of them
        window = [fused, *steps[i + 1 : j]]
        steps[i : j + 1] = self._sorted(window)
        for s, label in zip(steps[i:j], labels, strict=True):
            self.label[s] = label
        if self.rewritten:
            self._ordered_dependencies()
        changed = {n for n, count in old_readers.items() if self.readers.get(n, 0) != count}
        dirty = dict.fromkeys(steps[i:j])
        for name in changed:
            for s in self.users.get(name, ()):
                if name in self.writes[s]:
                    dirty[s] = None
        self._rescore(dirty)

    def _sorted(self, window: list[Step]) -> list[Step]:
        """:func:`stable_topological_sort` of ``window``, whose steps depend on no step
        after them."""
        index = {s: k for k, s in enumerate(window)}
        deps = {
            k: {index[d] for d in self.deps[s] | self.data_deps.get(s, set()) if d in index}
            for k, s in enumerate(window)
        }
        return [window[k] for k in stable_order(deps)]


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
    fused_schedule = Schedule(graph, _renamed(steps))
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


def _renamed(steps: list[Step]) -> list[Step]:
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
    deps = dependencies(steps)
    outputs = output_buffers(graph)
    remaining_readers: dict[str, int] = {}
    for s in steps:
        for name in step_reads(s):
            remaining_readers[name] = remaining_readers.get(name, 0) + 1
    done: set[int] = set()
    result: list[Step] = []
    while len(result) < len(steps):
        ready = [i for i in range(len(steps)) if i not in done and deps[i] <= done]

        def net(i: int) -> int:
            s = steps[i]
            allocated = sum(
                graph.hint(buffers[n].nbytes())
                for n in step_writes(s)
                if not (isinstance(s, Kernel) and n in s.local_buffers)
            )
            freed = sum(
                graph.hint(buffers[n].nbytes())
                for n in step_reads(s)
                if remaining_readers.get(n) == 1
                and n not in outputs
                and n in buffers
                and not _is_input(graph, n)
            )
            return allocated - freed

        best = min(ready, key=lambda i: (net(i), i))
        done.add(best)
        result.append(steps[best])
        for name in step_reads(steps[best]):
            remaining_readers[name] -= 1
    return Schedule(graph, _renamed(result))


def _is_input(graph: LoopGraph, name: str) -> bool:
    return any(i.buffer is not None and i.buffer.name == name for i in graph.inputs)
