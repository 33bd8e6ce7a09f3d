import ctypes

import pytest
import sympy
from torch.utils._sympy.functions import (
    CeilToInt,
    FloatPow,
    FloorDiv,
    IntTrueDiv,
    ModularIndexing,
    PythonMod,
    RoundToInt,
    ToFloat,
)

from kiln_cpp.build import build, load
from kiln_cpp.prelude import PRELUDE
from kiln_cpp.printer import cexpr
from kiln_loopir.testing.size_expressions import SIZE_EXPRESSIONS, expected

x = sympy.Symbol("x1", integer=True)


def test_floor_division_and_modulo_print_as_flooring_helpers():
    # torch's sympy functions print themselves as Python ("//") unless the printer says not to
    assert cexpr(FloorDiv(x - 1, 2)) == "kiln::floordiv<int64_t>((x1 + -1), 2)"
    assert (
        cexpr(ModularIndexing(x, 3, 4)) == "kiln::mod<int64_t>(kiln::floordiv<int64_t>(x1, 3), 4)"
    )
    assert cexpr(PythonMod(x - 1, 3)) == "kiln::mod<int64_t>((x1 + -1), 3)"
    assert cexpr(sympy.Integer(2**40)) == "INT64_C(1099511627776)"


def test_float_and_rounding_functions_print_as_double_math():
    assert cexpr(CeilToInt(IntTrueDiv(x, 3))) == (
        "static_cast<int64_t>(std::ceil((static_cast<double>(x1) / 3.0)))"
    )
    assert cexpr(FloatPow(ToFloat(x), -0.5)) == ("std::pow(static_cast<double>(x1), -0.5)")
    assert cexpr(RoundToInt(ToFloat(x))).startswith("static_cast<int64_t>(std::nearbyint(")


def test_a_function_kiln_does_not_print_is_refused_by_name():
    mystery = sympy.Function("Mystery", integer=True)
    with pytest.raises(NotImplementedError, match=r"Mystery\(x1\) as C\+\+"):
        cexpr(mystery(x) + 1)


@pytest.fixture(scope="module")
def size_expression_library():
    """Every expression of kiln_loopir's size-expression table as a C++ function of
    ``int64_t a, int64_t b`` returning a ``double``, built into one library."""
    functions = [
        f'extern "C" double size_{name}(int64_t a, int64_t b) {{\n'
        f"  return static_cast<double>({cexpr(case.expr)});\n}}\n"
        for name, case in SIZE_EXPRESSIONS.items()
    ]
    library = load(build(PRELUDE + "\n".join(functions))[0])
    for name in SIZE_EXPRESSIONS:
        getattr(library, f"size_{name}").restype = ctypes.c_double
        getattr(library, f"size_{name}").argtypes = [ctypes.c_int64, ctypes.c_int64]
    return library


@pytest.mark.parametrize("name", sorted(SIZE_EXPRESSIONS))
def test_printed_cpp_computes_what_sympy_does(size_expression_library, name):
    """Negative values included: divisions and remainders floor, rounding is half to even,
    float sizes are doubles, as in Python."""
    case, function = SIZE_EXPRESSIONS[name], getattr(size_expression_library, f"size_{name}")
    for a, b in case.values:
        want = expected(case.expr, a, b)
        assert function(a, b) == pytest.approx(want, rel=1e-12), (a, b, cexpr(case.expr))
