"""Small matrix products on the CPU are lowered to a reduction over k (no extern call) that
fuses with its neighbours; big ones, symbolic sizes and other dtypes stay ATen calls.

Each case runs against eager with fresh random inputs, through the reference codegen and
through kiln-cpp when it is installed."""

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from kiln_loopir import Kernel
from kiln_loopir.ir import ComputedNode, ExternNode, Reduction
from kiln_loopir.lowering import matmul
from kiln_loopir.testing import check_against_eager

aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def _codegens():
    # kiln-cpp when installed (found by name: kiln-loopir depends on no codegen package)
    return ["reference", "cpp"] if importlib.util.find_spec("kiln_cpp") else ["reference"]


CODEGENS = pytest.mark.parametrize("codegen", _codegens())


def _externs(compiled):
    return [s for s in compiled.schedule.steps if not isinstance(s, Kernel)]


def _matmul_externs(compiled):
    return [s for s in _externs(compiled) if getattr(s, "target", None) in MATMULS]


def _dots(compiled):
    return [
        n
        for n in compiled.graph.nodes
        if isinstance(n, ComputedNode)
        and isinstance(n.body, Reduction)
        and n.body.reduction_type == "dot"
    ]


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _check_inlined(fn, make_inputs, codegen, dtype=torch.float32, kernels=1):
    """Compile on one set of inputs, run against eager on another; no matmul extern, one
    dot reduction over k per product, no buffer as large as m * k * n."""
    inputs = make_inputs(dtype)
    compiled = check_against_eager(fn, inputs, codegen=codegen, run_inputs=make_inputs(dtype))
    assert _matmul_externs(compiled) == [], compiled.schedule
    assert _dots(compiled), compiled.graph
    if kernels is not None:
        assert len(compiled.kernels) == kernels, compiled.schedule
    for node in compiled.graph.nodes:
        if isinstance(node, (ComputedNode, ExternNode)):
            for buf in [node.buffer] if isinstance(node, ComputedNode) else node.outputs:
                numel = math.prod(int(s) for s in buf.size) if buf is not None else 0
                assert numel <= 4096, f"{buf.name} holds {numel} elements: a product spilled"
    return compiled


CASES = {
    "mm": (torch.mm, lambda d: [_randn(8, 32, dtype=d), _randn(32, 16, dtype=d)]),
    "mm_vector": (torch.mm, lambda d: [_randn(1, 64, dtype=d), _randn(64, 64, dtype=d)]),
    "addmm": (
        torch.addmm,
        lambda d: [_randn(16, dtype=d), _randn(4, 8, dtype=d), _randn(8, 16, dtype=d)],
    ),  # fmt: skip
    "addmm_alpha_beta_2d_bias": (
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0),
        lambda d: [_randn(4, 16, dtype=d), _randn(4, 8, dtype=d), _randn(8, 16, dtype=d)],
    ),
    "linear_transposed_weight": (
        F.linear,
        lambda d: [_randn(16, 64, dtype=d), _randn(64, 64, dtype=d), _randn(64, dtype=d)],
    ),
    "bmm": (torch.bmm, lambda d: [_randn(4, 16, 16, dtype=d), _randn(4, 16, 16, dtype=d)]),
    "baddbmm": (
        lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5),
        lambda d: [_randn(1, 5, dtype=d), _randn(3, 4, 6, dtype=d), _randn(3, 6, 5, dtype=d)],
    ),
    "both_transposed": (
        lambda a, b: a.t() @ b.t(),
        lambda d: [_randn(32, 8, dtype=d), _randn(16, 32, dtype=d)],
    ),
    "sliced_operand": (
        lambda a, b: a[:, ::2] @ b[1:],
        lambda d: [_randn(8, 64, dtype=d), _randn(33, 12, dtype=d)],
    ),
    "bmm_transposed": (
        lambda a, b: torch.bmm(a, b.transpose(1, 2)),
        lambda d: [_randn(2, 8, 16, dtype=d), _randn(2, 12, 16, dtype=d)],
    ),
}


@CODEGENS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_small_matmul_equals_eager_without_an_extern_call(name, dtype, codegen):
    fn, make_inputs = CASES[name]
    # (traced half-precision baddbmm converts its operands in kernels of their own)
    _check_inlined(fn, make_inputs, codegen, dtype, kernels=None)


@CODEGENS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_relu_is_one_kernel(dtype, codegen):
    compiled = _check_inlined(
        lambda x, w, b: F.relu(F.linear(x, w, b)),
        lambda d: [_randn(2, 32, dtype=d), _randn(48, 32, dtype=d), _randn(48, dtype=d)],
        codegen,
        dtype,
    )
    (kernel,) = compiled.kernels
    assert [str(r) for r in kernel.kernel.reduction_ranges] == ["32"]


@CODEGENS
def test_mlp_is_one_kernel_per_layer(codegen):
    layers = [torch.nn.Linear(32, 32) for _ in range(4)]
    params = [p.detach() for layer in layers for p in (layer.weight, layer.bias)]

    def fn(x, *ps):
        for i in range(0, len(ps), 2):
            x = torch.tanh(F.linear(x, ps[i], ps[i + 1]))
        return x

    _check_inlined(fn, lambda d: [_randn(1, 32), *params], codegen, kernels=4)


@CODEGENS
def test_matmul_bias_gelu_then_pointwise_is_one_kernel(codegen):
    _check_inlined(
        lambda x, w, b, y: F.gelu(torch.addmm(b, x, w)) * y + 1,
        lambda d: [_randn(4, 16), _randn(16, 24), _randn(24), _randn(4, 24)],
        codegen,
    )


@CODEGENS
@pytest.mark.parametrize(
    "fn, inputs",
    [
        (torch.mm, [_randn(64, 64), _randn(64, 64)]),  # 2^18 multiply-adds
        (F.linear, [_randn(32, 128), _randn(128, 128), _randn(128)]),
        (torch.bmm, [_randn(8, 32, 32), _randn(8, 32, 32)]),
        (torch.mm, [_randn(1, 8192), _randn(8192, 2)]),  # a long k
    ],
)
def test_big_matmul_stays_an_extern_call(fn, inputs, codegen):
    compiled = check_against_eager(fn, inputs, codegen=codegen)
    assert len(_matmul_externs(compiled)) == 1
    assert not _dots(compiled)


@CODEGENS
def test_other_dtypes_and_symbolic_sizes_stay_extern_calls(codegen):
    ints = [torch.randint(-5, 5, (4, 8)), torch.randint(-5, 5, (8, 4))]
    assert len(_matmul_externs(check_against_eager(torch.mm, ints, codegen=codegen))) == 1
    doubles = [_randn(4, 8, dtype=torch.float64), _randn(8, 4, dtype=torch.float64)]
    assert len(_matmul_externs(check_against_eager(torch.mm, doubles, codegen=codegen))) == 1
    dynamic = check_against_eager(
        torch.mm,
        [_randn(5, 8), _randn(8, 3)],
        codegen=codegen,
        dynamic=True,
        run_inputs=[_randn(6, 9), _randn(9, 7)],
    )
    assert len(_matmul_externs(dynamic)) == 1


def test_switched_off_every_product_is_an_extern_call(monkeypatch):
    monkeypatch.setattr(matmul, "INLINE_MATMUL_MAX_MNK", 0)
    compiled = check_against_eager(
        lambda x, w, b: F.relu(F.linear(x, w, b)), [_randn(2, 8), _randn(8, 8), _randn(8)]
    )
    assert len(_matmul_externs(compiled)) == 1
    assert not _dots(compiled)


def test_not_on_other_devices():
    """The decision looks at the graph's device: a meta graph keeps its ATen call."""
    from kiln_loopir.lowering import lower
    from kiln_loopir.testing import trace_aten

    x, w = _randn(4, 8), _randn(8, 4)
    gm = trace_aten(torch.mm, [x, w])
    graph = lower(gm, [x, w])
    assert not any(isinstance(n, ExternNode) for n in graph.nodes)
    meta = [x.to("meta"), w.to("meta")]
    graph = lower(trace_aten(torch.mm, meta), meta)
    assert [n.target for n in graph.nodes if isinstance(n, ExternNode)] == [aten.mm.default]
