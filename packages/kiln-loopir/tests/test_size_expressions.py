"""Size expressions past polynomials (torch's ToFloat, IntTrueDiv, CeilToInt, FloatPow,
OpaqueUnaryFn_sqrt ...) printed as the host program's Python: the printed code computes
what sympy does, on numbers and elementwise on tensors (the reference kernels' index
variables), and a function kiln does not print is refused by name."""

from __future__ import annotations

import math

import pytest
import sympy
import torch

from kiln_loopir.symbols import evaluate, py_expr
from kiln_loopir.testing import compile_symbolic
from kiln_loopir.testing.size_expressions import SIZE_EXPRESSIONS, A, expected


@pytest.mark.parametrize("name", sorted(SIZE_EXPRESSIONS))
def test_printed_python_computes_what_sympy_does(name):
    case = SIZE_EXPRESSIONS[name]
    for a, b in case.values:
        got = evaluate(case.expr, {"a": a, "b": b})
        assert got == pytest.approx(expected(case.expr, a, b), rel=1e-12), (
            py_expr(case.expr),
            a,
            b,
        )


@pytest.mark.parametrize("name", sorted(n for n, c in SIZE_EXPRESSIONS.items() if c.tensors))
def test_printed_python_computes_elementwise_on_tensors(name):
    case = SIZE_EXPRESSIONS[name]
    a, b = (torch.tensor(v) for v in zip(*case.values, strict=True))
    got = torch.as_tensor(evaluate(case.expr, {"a": a, "b": b})).to(torch.float64)
    want = torch.tensor([expected(case.expr, *v) for v in case.values], dtype=torch.float64)
    torch.testing.assert_close(got.expand_as(want), want, rtol=1e-12, atol=0)


def test_float_and_rounding_functions_print_as_named_helpers():
    from torch.utils._sympy.functions import CeilToInt, FloatPow, IntTrueDiv, ToFloat

    assert py_expr(CeilToInt(IntTrueDiv(A, 3))) == "ceil_to_int(true_div(a, 3))"
    assert py_expr(FloatPow(ToFloat(A), -0.5)) == "float_pow(to_float(a), -0.5)"


def test_a_function_kiln_does_not_print_is_refused_by_name():
    mystery = sympy.Function("Mystery", integer=True)
    with pytest.raises(NotImplementedError, match=r"Mystery\(a\).*Mystery is not a function"):
        py_expr(mystery(A) + 1)


def test_a_graph_sliced_by_a_ceiling_runs_at_every_size():
    def fn(x):
        return x[:, : math.ceil(x.shape[1] / 3)] * x.shape[1] ** -0.5

    compiled = compile_symbolic(fn, [torch.randn(2, 7)])
    assert "ceil_to_int(true_div(" in compiled.host_source  # the readable host program
    for n in (4, 5, 9, 30):
        x = torch.randn(3, n)
        torch.testing.assert_close(compiled(x)[0], fn(x))
