import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing, PythonMod

from kiln_cpp.printer import cexpr

x = sympy.Symbol("x1", integer=True)


def test_floor_division_and_modulo_print_as_flooring_helpers():
    # torch's sympy functions print themselves as Python ("//") unless the printer says not to
    assert cexpr(FloorDiv(x - 1, 2)) == "kiln::floordiv<int64_t>((x1 + -1), 2)"
    assert (
        cexpr(ModularIndexing(x, 3, 4)) == "kiln::mod<int64_t>(kiln::floordiv<int64_t>(x1, 3), 4)"
    )
    assert cexpr(PythonMod(x - 1, 3)) == "kiln::mod<int64_t>((x1 + -1), 3)"
    assert cexpr(sympy.Integer(2**40)) == "INT64_C(1099511627776)"
