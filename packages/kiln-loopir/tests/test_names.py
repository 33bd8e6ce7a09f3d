"""Kernel names: made of the ops the kernels compute, unique, deterministic, identifiers."""

import keyword
import re

import pytest
import sympy
import torch
import torch.nn.functional as F

from kiln_loopir import Buffer, ComputedNode, Pointwise, lower
from kiln_loopir.names import MAX_CHARS, MAX_OPS, describe, kernel_name, op_word
from kiln_loopir.testing import check_against_eager, trace_aten

C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def block(x, w, b, w1, w2):
    """A transformer-like block: layer norm and gelu, attention-like softmax, an MLP."""
    h = F.gelu(F.layer_norm(x, (8,), w, b))
    a = torch.softmax(h @ h.t(), dim=-1)
    m = F.relu(a @ w1 + 1.0) @ w2
    return m + x.sum(0)


def block_inputs():
    g = torch.Generator().manual_seed(0)
    sizes = [(4, 8), (8,), (8,), (4, 16), (16, 8)]
    return [torch.randn(*s, generator=g) for s in sizes]


def names_of(fn, inputs):
    return [k.name for k in check_against_eager(fn, inputs).kernels]


def test_names_describe_the_ops():
    names = names_of(block, block_inputs())
    assert names == [  # the small products are kernels (a sum over k) on the CPU
        "kiln_sum_0",
        "kiln_fused_layer_norm_gelu_1",
        "kiln_mm_2",
        "kiln_softmax_3",
        "kiln_fused_mm_add_relu_4",
        "kiln_fused_mm_add_5",
    ]


def test_a_decomposed_norm_is_named_for_the_norm():
    ln_gelu = lambda x, w, b: F.gelu(F.layer_norm(x, (8,), w, b))  # noqa: E731
    (name,) = names_of(ln_gelu, block_inputs()[:3])
    assert "layer_norm" in name and "gelu" in name
    assert "var_mean" not in name and "rsqrt" not in name


def test_names_are_unique_identifiers_and_deterministic():
    first = names_of(block, block_inputs())
    second = names_of(block, block_inputs())
    assert first == second
    assert len(set(first)) == len(first)
    for name in first:
        assert C_IDENTIFIER.fullmatch(name) and name.isidentifier(), name
        assert not keyword.iskeyword(name) and name.startswith("kiln_")
        assert re.search(r"_\d+$", name), name


def test_nodes_record_the_ops_they_come_from():
    x = torch.randn(2, 3)
    graph = lower(trace_aten(lambda x: torch.cat([x.exp(), x * 2]).sin(), [x]), [x])
    origins = [node.origins for node in graph.nodes]
    # cat inlines its producers (the exp and the mul): its node records their ops first
    assert ("aten.exp.default", "aten.mul.Tensor", "aten.cat.default") in origins
    assert ("aten.sin.default",) in origins


@pytest.mark.parametrize(
    ("origin", "word"),
    [
        ("aten.native_layer_norm.default", "layer_norm"),
        ("aten._native_batch_norm_legit_no_training.default", "batch_norm"),
        ("aten._to_copy.default", "to_copy"),
        ("aten._softmax.default", "softmax"),
        ("aten.add.Tensor", "add"),
        ("aten.add", "add"),
        ("prims.convert_element_type.default", "convert"),
        ("mylib.my_op.default", "my_op"),
        ("getitem", "getitem"),
        ("aten.__and__.Tensor", "and"),
    ],
)
def test_op_words(origin, word):
    assert op_word(origin) == word


def _node(*origins):
    buf = Buffer("buf0", torch.float32, torch.device("cpu"), (sympy.S(4),), (sympy.S.One,))
    return ComputedNode(buf, Pointwise(buf.size, lambda ops, index: ops.constant(0.0)), origins)


def test_long_op_lists_are_cut_and_say_so():
    ops = ["aten.sin.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.relu.default"]
    assert describe([_node(*ops)]) == "kiln_fused_sin_add_mul_relu"
    more = describe([_node(*ops, "aten.exp.default")])
    assert more == "kiln_fused_sin_add_mul_etc"
    assert len(more.split("_")) - 2 <= MAX_OPS
    long = describe([_node("aten." + "x" * 80 + ".default", "aten.exp.default")])
    assert long.endswith("_etc") and len(long) <= len("kiln_fused_") + MAX_CHARS


def test_ops_are_named_once_in_node_order_and_nodes_without_origins_by_kind():
    nodes = [_node("aten.exp.default"), _node("aten.add.Tensor", "aten.exp.default")]
    assert kernel_name(nodes, 7) == "kiln_fused_exp_add_7"
    assert kernel_name([_node()], 0) == "kiln_pointwise_0"


def test_decomposition_keeps_the_origin_a_graph_recorded():
    from kiln_loopir import decompose

    inputs = block_inputs()[:3]
    gm = trace_aten(lambda x, w, b: F.layer_norm(x.exp(), (8,), w, b), inputs)
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.exp.default:
            node.meta["original_aten"] = torch.ops.aten.softplus.default  # as a tracer says
    decomposed = decompose(gm)
    origins = {str(n.meta.get("original_aten")) for n in decomposed.graph.nodes
               if n.op == "call_function"}  # fmt: skip
    assert origins == {"aten.softplus.default", "aten.native_layer_norm.default"}
    graph = lower(decomposed, inputs)
    assert {o for n in graph.nodes for o in n.origins} == origins
