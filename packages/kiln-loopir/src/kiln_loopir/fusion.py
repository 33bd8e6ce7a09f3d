"""Fusion: which kernels may merge, into what iteration space, and what it saves.

Rules (checked in :func:`try_fuse`):

- vertical: a consumer joins its producer when it reads the produced buffer only at the
  point where it was written (pointwise chains; pointwise producers into a reduction over
  the same points; a reduction into consumers over its outer ranges or over its whole
  space: softmax and layernorm+gelu become one kernel);
- horizontal: independent kernels over the same space that read a common buffer merge;
- never across a dependency through a third step (that would form a cycle), never a
  Scatter (it writes where an index says) or a Scan (it stores at every step), never across
  devices;
- never a pointwise kernel into a reduction of a big space to one point (a full sum),
  except as a producer the reduction reads: such a kernel runs as one program (one
  thread block, one thread), and the pointwise work would run there serially too.

The score of a pair is the bytes of memory traffic the merge saves (at the example
inputs' sizes): a buffer passed from one to the other is not read again (and, once no
other step reads it, not written either); a buffer both read is read once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy

from kiln_loopir.ir import LoopGraph, Scan, Scatter, TensorRef
from kiln_loopir.kernel import Kernel, _same, inner_orders, node_level


def merged_space(a: Kernel, b: Kernel) -> tuple[list, list] | None:
    """The iteration space a kernel holding the nodes of ``a`` and ``b`` would have."""
    candidates = []
    if a.reduction_ranges or b.reduction_ranges:
        big = a if a.reduction_ranges else b
        candidates.append((big.ranges, big.reduction_ranges))
    else:
        candidates.append((a.ranges, []))
        for short, long in ((a, b), (b, a)):
            n = len(short.ranges)
            if len(long.ranges) > n and _same(long.ranges[:n], short.ranges):
                candidates.append((short.ranges, long.ranges[n:]))
    for ranges, rranges in candidates:
        nodes = a.nodes + b.nodes
        if all(
            node_level(n, ranges, rranges) is not None or inner_orders(n, ranges, rranges)
            for n in nodes
        ):
            return list(ranges), list(rranges)
    return None


MAX_TRIES = 16
# a reduction to one point over more elements than this runs serially in one program
SERIAL_LIMIT = 4096


def serializes(a: Kernel, b: Kernel, space: tuple[list, list]) -> bool:
    """Whether fusing would move pointwise work (other than a producer the reduction
    reads) into one program reducing a big space to a single point."""
    ranges, rranges = space
    if not rranges or sympy.prod(ranges) != 1:
        return False
    size = sympy.prod(rranges)
    if size.is_number and int(size) <= SERIAL_LIMIT:
        return False
    producer_feeds_reduction = (
        not a.reduction_ranges and b.reduction_ranges and a.writes() & b.reads()
    )
    return bool(not (a.reduction_ranges and b.reduction_ranges) and not producer_feeds_reduction)


def try_fuse(a: Kernel, b: Kernel, name: str) -> Kernel | None:
    """``a`` and ``b`` (``a`` first) as one kernel, or None when a rule forbids it."""
    if any(isinstance(n.body, (Scatter, Scan)) for n in a.nodes + b.nodes):
        return None  # a scatter writes where an index says; a scan stores at every step
    if a.device != b.device:
        return None
    space = merged_space(a, b)
    if space is None or serializes(a, b, space):
        return None
    nodes = a.nodes + b.nodes
    # Pointwise nodes of the inner level may run with their loops reordered (a reduction
    # over leading dimensions): try one order for all of them first, then combinations.
    choices = [(n.name, inner_orders(n, *space)) for n in nodes if node_level(n, *space) != "outer"]
    choices = [(name, orders) for name, orders in choices if orders]
    uniform = []
    for order in dict.fromkeys(o for _, orders in choices for o in orders):
        uniform.append(tuple(order if order in orders else orders[0] for _, orders in choices))
    combos = itertools.chain(uniform, itertools.product(*[orders for _, orders in choices]))
    for combo in itertools.islice(combos, MAX_TRIES):
        orders = {
            name: order
            for (name, _), order in zip(choices, combo, strict=True)
            if order != tuple(range(len(order)))
        }
        fused = Kernel(name, space[0], space[1], nodes, orders=orders)
        if fused.same_point_reads():
            return fused
    return None


def score(
    a: Kernel,
    b: Kernel,
    reads: dict[int, set[str]],
    readers: dict[str, int],
    graph: LoopGraph,
    outputs: set[str],
    nbytes: dict[str, int],
) -> int:
    """Bytes of memory traffic saved by merging ``a`` and ``b`` (``nbytes`` per buffer)."""
    saved = 0
    for name in a.writes() & reads[id(b)]:
        size = nbytes[name]
        only_here = readers.get(name, 0) <= 1 and name not in outputs
        saved += size * (2 if only_here else 1)
    for name in reads[id(a)] & reads[id(b)]:
        saved += nbytes[name]
    return saved


def output_buffers(graph: LoopGraph) -> set[str]:
    return {o.buffer for o in graph.outputs if isinstance(o, TensorRef)}


def reachable(deps: dict[int, set[int]], start: int, goal: int, skip: Sequence[int]) -> bool:
    """Whether ``goal`` depends on ``start`` through a step not in ``skip``."""
    stack = [d for d in deps[goal] if d not in skip]
    seen: set[int] = set()
    while stack:
        s = stack.pop()
        if s == start:
            return True
        if s in seen:
            continue
        seen.add(s)
        stack.extend(deps[s])
    return False
