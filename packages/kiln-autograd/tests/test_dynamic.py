"""Dynamic shapes: SymInt inputs and symbolic sizes pass through to the graphs."""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import kiln_autograd


def reshape_softmax(x, n):
    return (x.view(n, -1).softmax(-1) * x.shape[1], x.shape[0])


def eager_and_compiled(compiled, shape, n):
    x = torch.randn(*shape, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out = compiled(x, n)
    expected = reshape_softmax(x_ref, n)
    torch.testing.assert_close(out[0], expected[0])
    assert out[1] == expected[1]
    weight = torch.randn_like(expected[0])
    (out[0] * weight).sum().backward()
    (expected[0] * weight).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_dynamic_true_compiles_once_for_every_size():
    gm = torch.fx.symbolic_trace(reshape_softmax)
    graphs = []
    compiled = kiln_autograd.aot(
        gm,
        [torch.randn(6, 4, requires_grad=True), 3],
        lambda g, _: graphs.append(g) or g,
        dynamic=True,
    )
    for shape, n in [((6, 4), 2), ((10, 7), 5), ((9, 3), 3)]:
        eager_and_compiled(compiled, shape, n)
    assert len(compiled.runners) == 1
    assert any(n.target == torch.ops.aten.sym_size.int for g in graphs for n in g.graph.nodes)


def test_fake_example_inputs_with_symints_pass_through():
    captured: list = []
    make_fx(lambda *a: captured.extend(a), tracing_mode="symbolic")(torch.randn(6, 4), 3)
    fake_x, sym_n = captured
    assert isinstance(sym_n, torch.SymInt)
    fake_x.requires_grad_(True)
    gm = torch.fx.symbolic_trace(reshape_softmax)
    compiled = kiln_autograd.aot(gm, [fake_x, sym_n], lambda g, _: g)
    for shape, n in [((12, 4), 4), ((5, 6), 10)]:
        eager_and_compiled(compiled, shape, n)
    assert len(compiled.runners) == 1


def test_static_shapes_recompile_for_a_new_size():
    gm = torch.fx.symbolic_trace(reshape_softmax)
    compiled = kiln_autograd.aot(gm, [torch.randn(6, 4, requires_grad=True), 3], lambda g, _: g)
    eager_and_compiled(compiled, (6, 4), 3)
    eager_and_compiled(compiled, (8, 4), 4)
    assert len(compiled.runners) == 2


def test_a_float_input_is_a_constant_even_with_dynamic_shapes():
    gm = torch.fx.symbolic_trace(lambda x, scale: (x * scale,))
    compiled = kiln_autograd.aot(gm, [torch.randn(3), 2.0], lambda g, _: g, dynamic=True)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x, 3.0)[0], x * 3.0)
    torch.testing.assert_close(compiled(x, 2.0)[0], x * 2.0)


def test_a_new_dtype_with_dynamic_shapes_is_traced_from_the_call():
    gm = torch.fx.symbolic_trace(reshape_softmax)
    compiled = kiln_autograd.aot(
        gm, [torch.randn(6, 4, requires_grad=True), 3], lambda g, _: g, dynamic=True
    )
    x = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    out, size = compiled(x, 5)
    assert out.dtype == torch.float64 and size == 10
    torch.testing.assert_close(out, reshape_softmax(x, 5)[0])


def test_real_inputs_of_a_graph_captured_with_symbolic_sizes_trace_symbolically():
    """kiln-capture's contract: real example inputs, and on each placeholder the fake value
    (``example_value``) whose sizes are capture's symbols. The graphs keep those symbols,
    and the guarded entry point (capture guards the calls) runs every size."""
    captured: list = []
    make_fx(lambda *a: captured.extend(a), tracing_mode="symbolic")(torch.randn(6, 4), 3)
    gm = torch.fx.symbolic_trace(reshape_softmax)
    for node, fake in zip(gm.graph.find_nodes(op="placeholder"), captured, strict=True):
        node.meta["example_value"] = fake
    graphs = []
    x = torch.randn(6, 4, requires_grad=True)
    compiled = kiln_autograd.aot(gm, [x, 3], lambda g, _: graphs.append(g) or g)
    assert compiled.options.dynamic
    shape_env = captured[0].fake_mode.shape_env
    placeholder = next(iter(graphs[0].graph.find_nodes(op="placeholder")))
    assert placeholder.meta["val"].fake_mode.shape_env is shape_env  # capture's symbols
    guarded = compiled.guarded()
    for shape, n in [((6, 4), 2), ((10, 7), 5), ((9, 3), 3)]:
        eager_and_compiled(guarded, shape, n)
    assert len(compiled.runners) == 1
    assert len(graphs) == 2  # one forward, one backward, for every size
