"""``fuse``: kernels merged greedily, best score first, with the bookkeeping of each round
kept for the next (the scheduler's :func:`~kiln_loopir.scheduler.fuse_reference` is the
same loop recomputed from scratch each round, which the tests compare it with)."""

from __future__ import annotations

import heapq

from kiln_loopir.fusion import output_buffers, score, try_fuse
from kiln_loopir.ir import ExternNode
from kiln_loopir.kernel import Kernel, Schedule, Step
from kiln_loopir.scheduler import (
    assign_locals,
    dependencies,
    renamed,
    stable_order,
    stable_topological_sort,
    step_reads,
    step_writes,
)


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
    fused_schedule = Schedule(schedule.graph, renamed(fuser.steps))
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
        self.joined: set[tuple[Kernel, Kernel]] = set()  # pairs a third step joins
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
        cycle). A path through data alone (buffers with one writer) outlasts every fusion
        that keeps ``a`` and ``b``, so such a pair is remembered in ``joined``; one through
        a buffer written twice (its dependencies follow the order) is searched again."""
        if not self.by_data:
            return self._path(a, b, {})
        if self._path(a, b, {}):
            self.joined.add((a, b))
            return True
        return bool(self.order_deps) and self._path(a, b, self.order_deps)

    def _path(self, a: Kernel, b: Kernel, order_deps: dict[Step, set[Step]]) -> bool:
        """Whether a path of dependencies (and ``order_deps``) leads from ``b`` back to
        ``a`` through a third step. Steps before ``a`` cannot depend on it, so the search
        stops there."""
        start = self.label[a]
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
            if (a, b) in self.joined or self._joined(a, b):
                held.append(entry)
                continue
            fused = try_fuse(a, b, f"kernel{self.count}")
            if fused is None:
                self.refused.add((a, b))
                continue
            held.append(entry)  # stale once a and b are gone (named when fusion ends)
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
        before = {s: self.label[s] for s in steps[i + 1 : j]}
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
        # the fused kernel and the steps the sort moved: their pairs' heap keys changed
        dirty = dict.fromkeys(s for s in steps[i:j] if before.get(s) != self.label[s])
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
