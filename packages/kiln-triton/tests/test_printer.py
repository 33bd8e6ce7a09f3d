"""Size expressions printed as Triton: every kind of kiln_loopir's size-expression table,
run in a one-program kernel (on the GPU, or in Triton's interpreter), computes what sympy
does, negative values included; a function kiln does not print is refused by name."""

from __future__ import annotations

import importlib.util

import pytest
import sympy
import torch
from torch.utils._sympy.functions import CeilToInt, IntTrueDiv

from kiln_loopir.testing.size_expressions import SIZE_EXPRESSIONS, A, expected
from kiln_triton.printer import texpr


@pytest.fixture(scope="module")
def size_expression_kernels(tmp_path_factory):
    """A module of one kernel per expression: ``size_<name>(out, a, b)`` stores the
    expression as a float64 (as a kernel's value, broadcast to a block)."""
    lines = [
        "import triton",
        "import triton.language as tl",
        "from kiln_triton import device as kt",
    ]
    for name, case in SIZE_EXPRESSIONS.items():
        lines += [
            "",
            "@triton.jit",
            f"def size_{name}(out, a, b):",
            f"    tl.store(out + tl.arange(0, 1), tl.zeros([1], tl.float64) + {texpr(case.expr)})",
        ]
    path = tmp_path_factory.mktemp("size-expressions") / "size_expression_kernels.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(SIZE_EXPRESSIONS))
def test_printed_triton_computes_what_sympy_does(size_expression_kernels, device, name):
    case = SIZE_EXPRESSIONS[name]
    kernel = getattr(size_expression_kernels, f"size_{name}")
    out = torch.empty(1, dtype=torch.float64, device=device)
    for a, b in case.values:
        kernel[(1,)](out, a, b)
        assert out.item() == pytest.approx(expected(case.expr, a, b), rel=1e-12), (
            a,
            b,
            texpr(case.expr),
        )


def test_a_quotient_rounds_in_float64():
    assert texpr(CeilToInt(IntTrueDiv(A, 3))) == (
        "kt.libdevice.ceil(((tl.zeros([], tl.float64) + a) / (tl.zeros([], tl.float64) + 3)))"
        ".to(tl.int64)"
    )


def test_a_function_kiln_does_not_print_is_refused_by_name():
    mystery = sympy.Function("Mystery", integer=True)
    with pytest.raises(NotImplementedError, match=r"Mystery\(a\) as Triton"):
        texpr(mystery(A) + 1)
