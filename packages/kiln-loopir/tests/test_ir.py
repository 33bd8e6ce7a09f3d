"""The IR prints, and verify() catches broken invariants."""

import pytest
import sympy
import torch

from kiln_loopir import (
    Buffer,
    ComputedNode,
    ExternNode,
    IRError,
    LoopGraph,
    Pointwise,
    TensorRef,
    TraceHandler,
    lower,
)
from kiln_loopir.ir import GraphInput
from kiln_loopir.testing import trace_aten

S = sympy.Integer


def buffer(name, *size):
    size = tuple(S(s) for s in size)
    stride = tuple(S(s) for s in (size[1], 1)) if len(size) == 2 else (S(1),)
    return Buffer(name, torch.float32, torch.device("cpu"), size, stride)


def graph_with(*nodes, outputs=()):
    x = buffer("x", 4)
    return LoopGraph([GraphInput("x", buffer=x)], list(nodes), list(outputs))


def test_trace_handler_records_loads_and_prints_lines():
    h = TraceHandler()
    i = sympy.Symbol("x0", integer=True)
    v = h.add(h.load("x", 2 * i + 1), h.constant(1.0, torch.float32))
    assert v == "tmp2"
    assert h.lines == [
        "tmp0 = load(x, 2*x0 + 1)",
        "tmp1 = constant(1.0, torch.float32)",
        "tmp2 = add(tmp0, tmp1)",
    ]
    assert [(ld.buffer, ld.index) for ld in h.loads] == [("x", 2 * i + 1)]


def test_trace_handler_reuses_common_subexpressions():
    h = TraceHandler()
    i = sympy.Symbol("x0", integer=True)
    assert h.load("x", i) == h.load("x", i)
    assert len(h.lines) == 1


def test_nested_masks_combine():
    h = TraceHandler()
    a, b = h.constant(True, torch.bool), h.constant(False, torch.bool)
    h.masked(a, lambda: h.masked(b, lambda: h.load("x", S(0)), 0.0), 0.0)
    assert any("logical_and(tmp0, tmp1)" in line for line in h.lines)
    assert "mask=tmp2" in h.lines[-3]


def test_verify_accepts_a_lowered_graph():
    x = torch.randn(3, 5)
    graph = lower(trace_aten(lambda x: x.softmax(-1) + x.sum(), [x]), [x])
    graph.verify()
    assert "Reduction(max" in str(graph)


def test_verify_rejects_a_load_of_an_undefined_buffer():
    out = buffer("buf0", 4)
    node = ComputedNode(out, Pointwise(out.size, lambda ops, i: ops.load("nowhere", i[0])))
    with pytest.raises(IRError, match="loads nowhere before it is defined"):
        graph_with(node).verify()


def test_verify_rejects_a_second_write():
    out = buffer("buf0", 4)
    body = Pointwise(out.size, lambda ops, i: ops.load("x", i[0]))
    with pytest.raises(IRError, match="written twice"):
        graph_with(ComputedNode(out, body), ComputedNode(out, body)).verify()


def test_verify_rejects_an_unknown_index_symbol():
    out = buffer("buf0", 4)
    j = sympy.Symbol("j", integer=True)
    node = ComputedNode(out, Pointwise(out.size, lambda ops, i: ops.load("x", i[0] + j)))
    with pytest.raises(IRError, match=r"uses \['j'\]"):
        graph_with(node).verify()


def test_verify_rejects_ranges_that_differ_from_the_buffer():
    out = buffer("buf0", 4)
    node = ComputedNode(out, Pointwise((S(5),), lambda ops, i: ops.load("x", i[0])))
    with pytest.raises(IRError, match="differ from the buffer size"):
        graph_with(node).verify()


def test_verify_rejects_an_output_of_an_unknown_buffer():
    ref = TensorRef("ghost", torch.float32, torch.device("cpu"), (S(4),), (S(1),), S(0))
    with pytest.raises(IRError, match="reads ghost before it is defined"):
        graph_with(outputs=[ref]).verify()


def test_views_are_index_remaps_on_one_buffer():
    x = torch.randn(4, 6)
    graph = lower(trace_aten(lambda x: x.t()[1:, ::2] * 2, [x]), [x])
    text = str(graph)
    # the view reads the input at remapped offsets: no copy node
    assert len(graph.nodes) == 1
    assert "load(arg0_1, 12*x1 + x0 + 1)" in text.replace("x0 + 12*x1", "12*x1 + x0")


def test_symbolic_sizes_flow_through():
    x = torch.randn(5, 7)
    graph = lower(trace_aten(lambda x: x.sum(1) * 2, [x], dynamic=True), [x])
    graph.verify()
    sizes = {str(s) for b in graph.buffers().values() for e in b.size for s in e.free_symbols}
    assert len(sizes) == 2  # both dimensions stay symbols


def test_symbolic_example_inputs_keep_their_symbols():
    """kiln-autograd hands over fake example inputs with symbolic sizes: lowering reads
    their hints without fixing their symbols in the ShapeEnv."""
    gm = trace_aten(lambda x: x.sum(1) * 2, [torch.randn(5, 7)], dynamic=True)
    fakes = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    graph = lower(gm, fakes)
    assert sorted(graph.size_hints.values()) == [5, 7]
    assert not fakes[0].fake_mode.shape_env.replacements  # no size fixed to a number
    assert {str(s) for e in graph.outputs[0].size for s in e.free_symbols}


def test_a_lowering_that_fixes_a_symbolic_size_is_refused(monkeypatch):
    from kiln_loopir import compile_fx
    from kiln_loopir.lowering import LOWERINGS

    gm = trace_aten(lambda x: x.sin(), [torch.randn(5, 7)], dynamic=True)
    fakes = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    sin = torch.ops.aten.sin
    real = LOWERINGS[sin]

    def specializing(ctx, *args):
        int(ctx.val.shape[0])  # asks the SymInt for its value: fixes its symbol to 5
        return real(ctx, *args)

    monkeypatch.setitem(LOWERINGS, sin, specializing)
    with pytest.raises(NotImplementedError, match=r"fixed symbolic sizes to numbers \(s\d+ = 5\)"):
        compile_fx(gm, fakes, codegen="reference")


def test_unlowered_ops_fall_back_and_are_logged_once(caplog):
    x = torch.randn(6, 3)
    caplog.set_level("INFO", logger="kiln.fallbacks")
    from kiln_loopir.lowering import extern

    extern._LOGGED.discard("aten.sort.default")
    for _ in range(2):
        graph = lower(trace_aten(lambda x: x.sort(0).values + 1, [x]), [x])
    assert "extern aten.sort.default" in str(graph)
    assert sum("aten.sort.default" in r.message for r in caplog.records) == 1


def test_mutating_graph_is_refused_with_advice():
    x = torch.randn(3)
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: x.clone().add_(1), tracing_mode="fake")(x)
    with pytest.raises(ValueError, match="functionalize"):
        lower(gm, [x])


def test_extern_result_takes_the_compiled_layout():
    """An ATen kernel may choose other strides than its meta function: the host program
    copies the result to the layout the kernels were compiled for."""
    from kiln_loopir.runtime import match_layout

    t = torch.randn(5, 3)
    assert match_layout(t, (5, 3), (3, 1), "out") is t
    other = torch.randn(3, 5).t()  # same values' size, column-major
    fixed = match_layout(other, (5, 3), (3, 1), "out")
    assert fixed.stride() == (3, 1) and torch.equal(fixed, other)
    with pytest.raises(ValueError, match="size"):
        match_layout(t, (4, 3), (3, 1), "out")


def test_factory_on_another_device_runs_through_aten():
    """A tensor made with another device= than the graph's cannot be a kernel of the
    graph's codegen: it becomes an extern op."""
    gm = trace_aten(lambda x: (x + 1, torch.ones(3, device="meta")), [torch.randn(3)])
    graph = lower(gm, [torch.randn(3)])
    externs = [n for n in graph.nodes if isinstance(n, ExternNode)]
    assert [n.outputs[0].device.type for n in externs] == ["meta"]
    assert any(isinstance(n, ComputedNode) for n in graph.nodes)


def test_scatter_shares_the_point_loop_but_is_no_pointwise():
    from kiln_loopir.ir import PointLoop, Scatter

    scatter = Scatter((S(4), S(1)), lambda ops, i: ops.constant(1.0, torch.float32),
                      lambda ops, i: i[0], accumulate=True)  # fmt: skip
    assert isinstance(scatter, PointLoop) and not isinstance(scatter, Pointwise)
    assert scatter.loop_ranges() == ([S(4)], [])
    handler = TraceHandler()
    assert scatter.call_index(handler, [sympy.Symbol("x0")]) == sympy.Symbol("x0")


@pytest.mark.parametrize(
    "fn, inputs, match",
    [
        (lambda x, t: torch.full((3,), t.item()) + x[:3], [torch.randn(8), torch.tensor(3.0)],
         r"uses a float read from tensor data"),
        (lambda x, t: x * (t.item() * 2), [torch.randn(8), torch.tensor(3.0)],
         r"uses a float read from tensor data"),
        (lambda x, t: (x, t.item()), [torch.randn(8), torch.tensor(3.0)],
         r"returns a float read from tensor data"),
        (lambda x, b: x * b.item(), [torch.randn(8), torch.tensor(True)],
         r"reads a SymBool from tensor data \(\.item"),
    ],
    ids=["float-fill", "float-arithmetic", "float-output", "bool"],
)  # fmt: skip
def test_reads_from_tensor_data_kernels_cannot_take_are_refused_clearly(fn, inputs, match):
    """A float read is an operand of pointwise math only, a bool read is not passed at
    all: lowering says so up front (no kernel that fails to build or a host program that
    fails by name later)."""
    gm = trace_aten(fn, inputs)
    with pytest.raises(NotImplementedError, match=match):
        lower(gm, inputs)


def test_extern_tuple_with_numbers_runs_and_passes_them_on():
    """Fused attention kernels return numbers beside tensors (max sequence lengths): the
    extern call holds the tensors, and consumers of the numbers get the traced values."""
    from kiln_loopir.testing import check_against_eager

    lib = torch.library.Library("kiln_loopir_test", "FRAGMENT")
    lib.define("scaled_rows(Tensor x) -> (Tensor, SymInt, Tensor)")
    lib.impl("scaled_rows", lambda x: (x * 2, x.shape[0], x.sum(0)), "CompositeExplicitAutograd")

    def fn(x):
        doubled, rows, column_sums = torch.ops.kiln_loopir_test.scaled_rows(x)
        return doubled.relu() * rows + column_sums

    gm = trace_aten(fn, [torch.randn(5, 3)])
    graph = lower(gm, [torch.randn(5, 3)])
    extern = next(n for n in graph.nodes if isinstance(n, ExternNode))
    assert extern.tuple_output and extern.outputs[1] is None
    check_against_eager(fn, [torch.randn(5, 3)])


def test_a_nodes_kept_trace_is_made_again_for_a_new_body():
    import dataclasses

    x = torch.randn(4, 6)
    graph = lower(trace_aten(lambda x: x.sin(), [x]), [x])
    (node,) = graph.nodes
    first = node.traced()
    assert node.traced() is first
    assert "sin(" in "\n".join(first[0].lines)
    node.body = dataclasses.replace(
        node.body, inner_fn=lambda ops, index: ops.cos(ops.load("arg0_1", index[0] * 6 + index[1]))
    )
    assert "cos(" in "\n".join(node.traced()[0].lines)
