"""Fusion rules, dependency order and the memory-aware order of the scheduler."""

import pytest
import torch
import torch.nn.functional as F

from kiln_loopir import (
    Kernel,
    decompose,
    eliminate_dead_nodes,
    fuse,
    lower,
    order,
    plan_memory,
)
from kiln_loopir import unfused_schedule as unfused
from kiln_loopir.fusion import merged_space
from kiln_loopir.lowering import matmul
from kiln_loopir.scheduler import fuse_reference
from kiln_loopir.testing import check_against_eager, trace_aten
from kiln_loopir.testing.cases import CASES


def schedules(fn, inputs):
    graph = lower(trace_aten(fn, inputs), inputs)
    eliminate_dead_nodes(graph)
    graph.verify()
    before = unfused(graph)
    before.verify()
    after = order(fuse(before))
    after.verify()
    check_against_eager(fn, inputs)
    return before, after


def kernels(schedule):
    return [s for s in schedule.steps if isinstance(s, Kernel)]


def test_horizontal_fusion_of_reductions_over_one_space():
    before, after = schedules(lambda x: (x.sum(1), x.amax(1), x.mean(1)), [torch.randn(5, 9)])
    assert len(kernels(before)) == 4  # sum, amax, mean's sum, mean's division
    assert len(kernels(after)) == 1


def test_horizontal_fusion_of_pointwise_kernels_sharing_an_input():
    _, after = schedules(lambda x: (x + 1, x * 2), [torch.randn(3, 4)])
    (k,) = kernels(after)
    assert k.reads() == {"arg0_1"}


def test_reductions_over_different_spaces_stay_apart():
    _, after = schedules(lambda x: (x.sum(0), x.sum(1)), [torch.randn(4, 6)])
    spaces = sorted((str(k.ranges), str(k.reduction_ranges)) for k in kernels(after))
    assert spaces == [("[4]", "[6]"), ("[6]", "[4]")]


def test_no_fusion_through_an_extern_dependency(monkeypatch):
    monkeypatch.setattr(matmul, "INLINE_MATMUL_MAX_MNK", 0)  # the product as an ATen call
    fn = lambda x, w: torch.mm(x.exp(), w) + x.exp()  # noqa: E731
    _, after = schedules(fn, [torch.randn(4, 4), torch.randn(4, 4)])
    kinds = ["kernel" if isinstance(s, Kernel) else "extern" for s in after.steps]
    assert kinds == ["kernel", "extern", "kernel"]


def test_consumer_reading_other_points_is_not_fused():
    # cat reads the row sums at shifted points; a reduction is not recomputed in its reader
    _, after = schedules(lambda x: torch.cat([x.sum(1), x.sum(1) * 2]), [torch.randn(4, 6)])
    assert len(kernels(after)) == 2


def test_pointwise_producer_read_through_a_transpose_is_inlined():
    _, after = schedules(lambda x: x.sin().t().contiguous() + 1, [torch.randn(4, 6)])
    (k,) = kernels(after)
    assert "sin(" in "\n".join(k.trace().lines)


def test_pointwise_producer_read_through_strided_slices_is_inlined():
    fn = lambda x: (x.exp()[:, ::2] * 3, x.exp()[1:, 1::3] + 1)  # noqa: E731
    _, after = schedules(fn, [torch.randn(6, 10)])
    assert all("exp(" in "\n".join(k.trace().lines) for k in kernels(after))
    assert not any(k for k in kernels(after) if "store(buf0" in "\n".join(k.trace().lines))


def _rotary_repeated(k, cos, sin):
    # a rotary key, then grouped-query attention's repeat of its heads (Llama's repeat_kv)
    half = k.shape[-1] // 2
    rotated = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    k_embed = k * cos + rotated * sin
    b, h, s, d = k_embed.shape
    return k_embed[:, :, None].expand(b, h, 2, s, d).reshape(b, 2 * h, s, d)


def test_producers_of_a_value_read_through_a_repeat_are_computed_with_it():
    inputs = [torch.randn(2, 4, 8, 16), torch.randn(8, 16), torch.randn(8, 16)]
    _, after = schedules(_rotary_repeated, inputs)
    (k,) = kernels(after)  # the two products are not written and read back
    assert len(k.ranges) == 5  # in the repeat's space: (2, 4, 2, 8, 16)
    assert k.writes() == {after.graph.outputs[0].buffer}


def test_a_value_with_other_readers_keeps_its_producers_apart():
    def fn(k, cos, sin):
        k_embed = k * cos + sin  # read by the repeat and by the second output
        b, h, s, d = k_embed.shape
        repeated = k_embed[:, :, None].expand(b, h, 2, s, d).reshape(b, 2 * h, s, d)
        return repeated, k_embed * 2

    inputs = [torch.randn(2, 4, 8, 16), torch.randn(8, 16), torch.randn(8, 16)]
    _, after = schedules(fn, inputs)
    (repeat,) = [k for k in kernels(after) if len(k.ranges) == 5]
    # k * cos is computed once, where k_embed is written for its other reader
    assert "mul(" not in "\n".join(repeat.trace().lines)


def test_small_chains_of_inlined_producers_inline_again():
    # the padding of a max pooling (itself computing the ReLU before it) is computed at each
    # window tap: one kernel after the shift, no padded buffer in memory
    def fn(x, shift):
        padded = F.pad(torch.relu(x + shift), (1, 1, 1, 1), value=float("-inf"))
        out = padded[:, :, 0:7:2, 0:7:2]
        for i, j in [(i, j) for i in range(3) for j in range(3)][1:]:
            out = torch.maximum(out, padded[:, :, i : i + 7 : 2, j : j + 7 : 2])
        return out

    _, after = schedules(fn, [torch.randn(2, 4, 8, 8), torch.randn(4, 1, 1)])
    assert len(kernels(after)) <= 2
    lines = "\n".join("\n".join(k.trace().lines) for k in kernels(after))
    assert "maximum(" in lines and "float('-inf')" in lines


def test_scatter_is_never_fused():
    fn = lambda x, i, s: x.scatter_add(0, i, s) * 2  # noqa: E731
    inputs = [torch.randn(5, 3), torch.randint(0, 5, (4, 3)), torch.randn(4, 3)]
    _, after = schedules(fn, inputs)
    scatter_kernels = [k for k in kernels(after) if any(n.body.kind == "Scatter" for n in k.nodes)]
    assert len(scatter_kernels) == 1 and len(scatter_kernels[0].nodes) == 1


def test_scan_computes_its_producer_and_is_never_fused():
    fn = lambda x: torch.cumsum(x.sin(), 0) * 2  # noqa: E731
    inputs = [torch.randn(6, 5)]
    graph = lower(trace_aten(fn, inputs), inputs, scans=True)
    eliminate_dead_nodes(graph)
    graph.verify()
    assert "Scan(sum, ranges=[6, 5], dim=0)" in str(graph) and "sin(" in str(graph)
    after = order(fuse(unfused(graph)))
    after.verify()
    scan_kernels = [k for k in kernels(after) if k.has_scan()]
    assert len(scan_kernels) == 1 and len(scan_kernels[0].nodes) == 1
    assert "ranges=[5] reduction_ranges=[6]" in scan_kernels[0].header()
    assert len(kernels(after)) == 2  # the scan (sin computed in it), the multiplication
    check_against_eager(fn, inputs)


def test_without_scans_a_cumulative_op_is_an_aten_call():
    inputs = [torch.randn(3, 5)]
    graph = lower(trace_aten(lambda x: torch.cumsum(x, 1), inputs), inputs)
    assert "extern aten.cumsum.default" in str(graph)


def test_pointwise_broadcast_consumer_joins_as_inner_level():
    # x.sum(1) then a [N, D] consumer of it: outer reduction + inner pointwise, one kernel
    _, after = schedules(lambda x: x - x.sum(1, keepdim=True) / 3, [torch.randn(4, 6)])
    (k,) = kernels(after)
    assert set(k.levels()) == {"reduction", "outer", "inner"} or set(k.levels()) == {
        "reduction",
        "inner",
    }


def test_merged_space_rules():
    x = torch.randn(4, 6)
    graph = lower(trace_aten(lambda x: (x.sum(1), x + 1, x.sum(0)), [x]), [x])
    row_sum, add, col_sum = unfused(graph).kernels()
    assert merged_space(row_sum, add) == ([4], [6])
    assert merged_space(col_sum, add) == ([6], [4])  # [4, 6] runs as [6] + [4] reordered
    assert merged_space(row_sum, col_sum) is None  # two reductions over other spaces


def test_order_keeps_live_memory_low():
    # two independent matmuls whose big results are each reduced: eager order keeps both
    def fn(x, w1, w2):
        a = torch.mm(x, w1)
        b = torch.mm(x, w2)
        return a.sum(), b.sum()

    inputs = [torch.randn(64, 8), torch.randn(8, 64), torch.randn(8, 64)]
    graph = lower(trace_aten(fn, inputs), inputs)
    program_order = unfused(graph)
    program_order.steps = [s for s in program_order.steps if not isinstance(s, Kernel)] + [
        s for s in program_order.steps if isinstance(s, Kernel)
    ]
    planned = order(program_order)
    planned.verify()
    big = 64 * 64 * 4
    assert plan_memory(program_order).peak_bytes >= 2 * big
    assert plan_memory(planned).peak_bytes < 2 * big
    check_against_eager(fn, inputs)


def test_reduction_over_leading_dims_fuses_with_reordered_loops():
    fn = lambda x: torch.softmax(x, 0)  # noqa: E731
    for shape in [(6, 5), (5, 5)]:  # a square shape: the order is chosen by the reads
        _, after = schedules(fn, [torch.randn(*shape)])
        (k,) = kernels(after)
        assert k.levels()[-1] == "inner" and list(k.orders.values()) == [(1, 0)]


def test_batch_norm_training_is_one_kernel():
    import torch.nn.functional as F

    fn = lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
    inputs = [torch.randn(4, 3, 5, 5), torch.randn(3), torch.randn(3)]
    graph = lower(decompose(trace_aten(fn, inputs)), inputs)
    eliminate_dead_nodes(graph)
    after = order(fuse(unfused(graph)))
    after.verify()
    assert len(kernels(after)) == 1
    check_against_eager(fn, inputs)


def test_inlining_stays_linear_in_the_graph_size():
    import time

    def fn(x):
        for _ in range(16):
            x = torch.cat([x, x], 0)[: x.shape[0] + 1]
        return x

    start = time.perf_counter()
    check_against_eager(fn, [torch.randn(3, 2)])
    assert time.perf_counter() - start < 30  # exponential re-inlining would take hours


def test_pointwise_work_stays_out_of_a_big_full_reduction():
    """A reduction to one point runs as one program: a big pointwise kernel merged into
    it would run serially there, so only a producer the sum reads joins it."""
    big = torch.randn(64, 256)  # over the serial limit
    _, after = schedules(lambda x: (x.sum(), x * 2), [big])
    assert len(kernels(after)) == 2
    _, after = schedules(lambda x: x - x.sum(), [big])
    assert len(kernels(after)) == 2
    _, after = schedules(lambda x: (x * 2).sum(), [big])
    assert len(kernels(after)) == 1
    _, after = schedules(lambda x: (x.sum(), x * 2), [torch.randn(8, 8)])  # small: one kernel
    assert len(kernels(after)) == 1


@pytest.mark.parametrize(
    "name",
    ["layer_norm_gelu", "softmax", "bmm_softmax", "scatter_add", "index_put", "slice_scatter",
     "var_mean", "cat", "embedding", "group_norm"],
)  # fmt: skip
def test_incremental_fuse_matches_the_reference_loop(name):
    """``fuse`` keeps its bookkeeping between rounds; ``fuse_reference`` recomputes it all
    each round, as the scheduler first did. Both must print the same schedule."""
    case = CASES[name]
    inputs = case.inputs(case.dtypes[0])
    graph = lower(decompose(trace_aten(case.fn, inputs)), inputs)
    eliminate_dead_nodes(graph)
    fast = order(fuse(unfused(graph)))
    reference = order(fuse_reference(unfused(graph)))
    fast.verify()
    assert str(fast) == str(reference)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_kernels_trace_made_of_its_nodes_is_the_whole_kernels_trace(name):
    """Fusion traces each candidate kernel: the trace is made of each node's share, traced
    once per way a kernel runs the node. Every kernel of every case, fused or not, gives
    the events, loads, symbols and store indices of the kernel traced whole."""
    from kiln_loopir.kernel import EventTrace

    case = CASES[name]
    inputs = case.inputs(case.dtypes[0])
    graph = lower(decompose(trace_aten(case.fn, inputs)), inputs)
    eliminate_dead_nodes(graph)
    for schedule in (unfused(graph), order(fuse(unfused(graph)))):
        for k in kernels(schedule):
            whole = EventTrace()
            stores = k.body(whole)
            parts = k.node_traces()
            if parts is None:  # indirect indexing: traced whole
                assert whole.indirect
                continue
            assert [e for p in parts for e in p.events] == whole.events
            got = [(ld.buffer, ld.index, ld.masked) for p in parts for ld in p.loads]
            assert got == [(ld.buffer, ld.index, ld.masked) for ld in whole.loads]
            assert frozenset().union(*(p.symbols for p in parts)) == whole.symbols
            assert {n.name: p.store for n, p in zip(k.nodes, parts, strict=True)} == stores


def test_incremental_fuse_matches_the_reference_loop_on_a_transformer_block():
    def block(x, w1, w2, g):
        h = F.layer_norm(x, (x.shape[-1],), g)
        a = torch.softmax(h @ h.transpose(-1, -2) / 4, -1) @ h
        y = F.gelu((x + a) @ w1) @ w2
        return F.layer_norm(x + a + y, (x.shape[-1],), g), (y * y).sum()

    inputs = [torch.randn(2, 5, 8), torch.randn(8, 16), torch.randn(16, 8), torch.randn(8)]
    graph = lower(decompose(trace_aten(block, inputs)), inputs)
    eliminate_dead_nodes(graph)
    fast = order(fuse(unfused(graph)))
    assert str(fast) == str(order(fuse_reference(unfused(graph))))


def test_a_kernels_trace_is_made_again_when_the_kernel_changes():
    # reads, symbols, same-point reads and in-place checks share one trace per kernel state
    def fn(x):
        y = x.sin()
        return y, y.cos()

    _, after = schedules(fn, [torch.randn(4, 6)])
    (k,) = kernels(after)
    first = k.traced()
    assert k.traced() is first
    stores = [e for e in first.handler.events if e[0] == "store"]
    k.local_buffers = set(k.writes())  # a local buffer is not stored
    assert k.traced() is not first
    assert not [e for e in k.traced().handler.events if e[0] == "store"]
    k.local_buffers = set()
    assert len([e for e in k.traced().handler.events if e[0] == "store"]) == 2
    assert len(stores) == 2
    second = k.traced()
    k.nodes = k.nodes[:1]
    assert k.traced() is not second
    assert k.writes() == {k.nodes[0].name}


def test_inner_orders_are_the_permutations_whose_sizes_match_in_their_order():
    import itertools
    import random

    import sympy

    from kiln_loopir.kernel import MAX_ORDERS, _equal, _inner_orders

    class Body:  # a Pointwise body's loop ranges, nothing else
        def __init__(self, ranges):
            self.ranges = ranges

        def loop_ranges(self):
            return self.ranges, []

    s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
    sizes = [2, 3, 3, s0, 2 * s0, s0 * 2, s1 + 1]
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(2, 6)
        full = [rng.choice(sizes) for _ in range(n)]
        split = rng.randint(1, n - 1)
        point = list(full)
        rng.shuffle(point)
        if rng.random() < 0.2:
            point[0] = 5  # sometimes no order fits
        want = [
            order
            for order in itertools.permutations(range(n))
            if all(_equal(point[i], full[order[i]]) for i in range(n))
        ][:MAX_ORDERS]
        assert _inner_orders(Body(point), full[:split], full[split:]) == want, (point, full)
