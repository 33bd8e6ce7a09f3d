"""Each stage on its own: traced graphs, the op set, custom decompositions, clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import kiln_autograd

aten = torch.ops.aten


class BNLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return (F.gelu(self.bn(self.lin(x))),)


def targets(gm: torch.fx.GraphModule) -> set:
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def test_joint_graph_takes_primals_and_tangents():
    gm = torch.fx.symbolic_trace(BNLinear().train())
    joint = kiln_autograd.trace_joint_graph(gm, [torch.randn(3, 4)])
    names = [n.name for n in joint.gm.graph.nodes if n.op == "placeholder"]
    # weight, bias, bn weight, bn bias, 3 buffers, x; one tangent.
    assert names == [f"primals_{i}" for i in range(1, 9)] + ["tangents_1"]
    assert joint.grad_inputs == (0, 1, 2, 3)
    assert joint.meta.mutated_inputs == (4, 5, 6)
    assert "def forward(self, primals_1" in str(joint)
    kiln_autograd.verify_op_set(joint.gm, "joint graph")


def test_joint_graph_values_stay_on_the_inputs_device():
    # "meta" stands in for CUDA here: a tangent made on the default device (CPU) would mix
    # devices in the backward, as it did on CUDA.
    gm = torch.fx.symbolic_trace(lambda x, w: ((x @ w).softmax(-1), (x @ w).sum()))
    inputs = [torch.randn(4, 8, device="meta", requires_grad=True) for _ in range(2)]
    inputs[1] = torch.randn(8, 8, device="meta", requires_grad=True)
    joint = kiln_autograd.trace_joint_graph(gm, inputs)
    devices = {
        n.meta["val"].device.type
        for n in joint.gm.graph.nodes
        if isinstance(n.meta.get("val"), torch.Tensor)
    }
    assert devices == {"meta"}


def test_inference_graph_returns_buffer_updates():
    gm = torch.fx.symbolic_trace(BNLinear().train())
    graph = kiln_autograd.trace_inference_graph(gm, [torch.randn(3, 4)])
    output = next(n for n in graph.gm.graph.nodes if n.op == "output")
    assert len(output.args[0]) == 1 + 3  # the output, then running mean, var, count
    assert aten._native_batch_norm_legit_functional.default in targets(graph.gm)
    assert not any(
        isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable for t in targets(graph.gm)
    )


def test_graphs_are_functional_after_inplace_ops():
    def f(x):
        y = x * 2
        y.add_(1)
        y[0].mul_(3)
        return (y.relu_(),)

    graph = kiln_autograd.trace_inference_graph(torch.fx.symbolic_trace(f), [torch.randn(3, 4)])
    kiln_autograd.verify_op_set(graph.gm)
    x = torch.randn(3, 4)
    torch.testing.assert_close(graph.gm(x)[0], f(x.clone())[0])


def test_op_set_table_lists_core_and_extra_ops():
    rows = dict(kiln_autograd.op_set_table())
    assert rows["aten.add"] == "core ATen IR"
    assert "aten._native_batch_norm_legit_functional.default" in rows
    assert "aten.t" not in rows  # decomposed to permute


def test_verify_op_set_names_the_offending_op():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(aten.add_.Tensor, (x, x)),))
    with pytest.raises(kiln_autograd.UnsupportedError, match=r"aten.add_.Tensor"):
        kiln_autograd.verify_op_set(torch.fx.GraphModule(torch.nn.Module(), graph))

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(torch.Tensor.t, (x,)),))
    with pytest.raises(kiln_autograd.UnsupportedError, match=r"method .t. .*decompositions="):
        kiln_autograd.verify_op_set(torch.fx.GraphModule(torch.nn.Module(), graph))


def test_an_op_with_no_decomposition_stays_whole_as_an_extern_call(caplog):
    def f(x):
        return (torch.fft.rfft(x.sin()).abs() * 2,)

    seen = []

    def compiler(gm, _):
        seen.append(targets(gm))
        return gm

    from kiln_autograd import fallbacks

    fallbacks._LOGGED.clear()
    caplog.set_level("INFO", logger="kiln.fallbacks")
    compiled = kiln_autograd.aot(
        torch.fx.symbolic_trace(f), [torch.randn(8, requires_grad=True)], compiler
    )
    x = torch.randn(8, requires_grad=True)
    (out,) = compiled(x)
    out.sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    (expected,) = f(x_ref)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert aten._fft_r2c.default in seen[0]
    assert aten._fft_c2c.default in seen[1]  # torch's formula for rfft's backward
    kiln_autograd.aot(torch.fx.symbolic_trace(f), [torch.randn(8, requires_grad=True)], compiler)
    logged = [r.message.split()[0] for r in caplog.records if r.name == "kiln.fallbacks"]
    assert "aten._fft_c2c.default" in logged
    assert len(logged) == len(set(logged))  # once per op


@pytest.mark.parametrize(
    "f, op",
    [
        (lambda x: (x.sin().max() + x,), aten.max.default),
        (lambda x: (torch.median(x.cos()) * x,), aten.median.default),
        (lambda x: (torch.kthvalue(x.sin(), 2, dim=1).values * 2,), aten.kthvalue.default),
        (lambda x: (torch.cumprod(x.sin(), 1) + 1,), aten.cumprod.default),
    ],
)
def test_fallback_ops_differentiate_with_torchs_formula(f, op):
    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, 5)
    joint = kiln_autograd.trace_joint_graph(gm, [x.clone().requires_grad_()])
    kiln_autograd.verify_op_set(joint.gm, "joint graph")
    assert op in targets(joint.gm)  # kept whole; its gradient is torch's formula for it
    _check_forward_and_backward(gm, f, x)


def _check_forward_and_backward(gm, f, x):
    """``aot`` of ``gm`` (graphs run as traced) against ``f``: output and input gradient."""
    compiled = kiln_autograd.aot(gm, [x.clone().requires_grad_()], lambda g, _: g)
    x_compiled, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    (out,) = compiled(x_compiled)
    (expected,) = f(x_ref)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x_compiled.grad, x_ref.grad)
    return compiled


def test_linalg_error_checks_are_kept_as_data():
    def f(x):
        return (torch.linalg.inv(x.sin()) * 2,)

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(3, 3) + 3 * torch.eye(3)
    compiled = _check_forward_and_backward(gm, f, x)
    with pytest.raises(torch.linalg.LinAlgError, match="torch.linalg.inv"):
        compiled(torch.zeros(3, 3, requires_grad=True))


def test_caller_decompositions_win():
    def tanh_gelu(x, approximate="none"):
        return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))

    gm = torch.fx.symbolic_trace(lambda x: (F.gelu(x),))
    joint = kiln_autograd.trace_joint_graph(
        gm, [torch.randn(4, requires_grad=True)], decompositions={aten.gelu.default: tanh_gelu}
    )
    assert aten.gelu.default not in targets(joint.gm)
    assert aten.tanh.default in targets(joint.gm)


def test_compilers_get_each_graph_with_fake_example_inputs():
    seen = []

    def fw(gm, example_inputs):
        seen.append(("fw", len(example_inputs)))
        return gm

    def bw(gm, example_inputs):
        seen.append(("bw", len(example_inputs)))
        return gm

    gm = torch.fx.symbolic_trace(lambda x, w: ((x @ w).sigmoid(),))
    compiled = kiln_autograd.aot(
        gm, [torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)], fw, bw
    )
    assert seen == [("fw", 2)]
    (out,) = compiled(torch.randn(2, 3), torch.randn(3, 3, requires_grad=True))
    assert seen == [("fw", 2)]  # the backward compiles on first use
    out.sum().backward()
    assert seen[1][0] == "bw"


def item(x):
    return (x * x.sum().item(),)


def boolean_mask(x):
    return (x[x > 0],)


class Branch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return (x,)
        return (x * 2,)


@pytest.mark.parametrize(
    "module, match",
    [
        (torch.fx.symbolic_trace(item), r"_local_scalar_dense.*\.item\(\)"),
        (torch.fx.symbolic_trace(boolean_mask), r"aten.nonzero"),
        (Branch(), r"_local_scalar_dense|branches on"),
    ],
)
def test_data_dependent_constructs_are_named(module, match):
    with pytest.raises(kiln_autograd.UnsupportedError, match=match):
        kiln_autograd.aot(module, [torch.randn(4, requires_grad=True)], lambda g, _: g)


def test_a_plain_function_is_refused_with_advice():
    with pytest.raises(TypeError, match="symbolic_trace"):
        kiln_autograd.aot(item, [torch.randn(4)], lambda g, _: g)


def test_tangents_take_the_layouts_analyze_found():
    # analyze keeps the differentiable values' layouts where sizes are numbers: the joint
    # trace makes its tangents from them rather than running the graph once more
    def fn(x, w):
        return (x @ w).relu(), x.sum().detach()

    gm = torch.fx.symbolic_trace(fn)
    inputs = [torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)]
    joint = kiln_autograd.trace_joint_graph(gm, inputs)
    assert joint.meta.tangent_layouts == (((3, 5), torch.float32, torch.device("cpu")),)
    tangents = [n for n in joint.gm.graph.nodes if n.name.startswith("tangents")]
    assert [tuple(n.meta["val"].shape) for n in tangents] == [(3, 5)]
    dynamic = kiln_autograd.trace_joint_graph(gm, inputs, dynamic=True)
    assert dynamic.meta.tangent_layouts is None  # symbolic sizes: found by running fn
    assert len([n for n in dynamic.gm.graph.nodes if n.name.startswith("tangents")]) == 1


def test_aten_nodes_keep_the_source_lines_of_the_nodes_they_come_from():
    gm = torch.fx.symbolic_trace(BNLinear().train())
    for node in gm.graph.nodes:  # as kiln-capture records them
        if node.op in ("call_function", "call_module"):
            node.meta["stack_trace"] = f'  File "model.py", line 7, in forward\n    {node.name}\n'
    joint = kiln_autograd.trace_joint_graph(gm, [torch.randn(3, 4)])
    forward_ops = [
        n for n in joint.gm.graph.nodes if n.target in (aten.addmm.default, aten.gelu.default)
    ]
    assert forward_ops and all("model.py" in n.meta.get("stack_trace", "") for n in forward_ops)
    assert "# File: model.py:7 in forward, code: gelu" in joint.gm.print_readable(False)


def test_analyze_runs_on_fresh_copies_of_its_fake_inputs():
    """Each input gets its own storage in its own layout (an expanded one stays expanded),
    and one that requires grad is a non-leaf, as a graph writing into it needs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln_autograd.analyze import _fresh_input

    mode = FakeTensorMode()
    with mode:
        weight = torch.empty(4, 3, requires_grad=True)
        row = torch.empty(1, 3).expand(5, 3)
        for value in (weight, row):
            fresh = _fresh_input(value)
            assert fresh.shape == value.shape and fresh.stride() == value.stride()
            assert fresh.untyped_storage()._cdata != value.untyped_storage()._cdata
            assert fresh.requires_grad == value.requires_grad
            assert fresh.fake_mode is mode and fresh.device == value.device
        assert not _fresh_input(weight).is_leaf  # it may be written in place
        _fresh_input(weight).add_(1)
