"""Pointwise kernels split where their index comparisons change (``kiln_cpp.index_facts``):
``cat`` and padding run one loop nest per piece, each with its comparisons decided."""

import pytest
import sympy
import torch
import torch.nn.functional as F

from kiln_cpp import CppCodegen
from kiln_cpp.index_facts import MAX_PIECES, IndexFacts, pieces
from kiln_loopir.testing import check_against_eager


def _source(compiled) -> str:
    return "\n".join(k.source for k in compiled.kernels)


def test_cat_of_pointwise_results_runs_each_source_on_its_own_piece():
    x, y = torch.randn(1000), torch.randn(777)
    compiled = check_against_eager(
        lambda a, b: torch.cat([a.sin(), b.cos()]) * 3, [x, y], codegen=CppCodegen()
    )
    source = _source(compiled)
    assert "// piece: 0 <= x0 < 1000" in source and "// piece: 1000 <= x0 < 1777" in source
    assert " ? " not in source  # no per-element select left


def test_cat_along_the_last_dimension_of_three_inputs():
    a, b, c = torch.randn(33, 5), torch.randn(33, 17), torch.randn(33, 1)
    compiled = check_against_eager(
        lambda a, b, c: torch.cat([a.exp(), b * 2, c.neg()], dim=1).relu(),
        [a, b, c],
        codegen=CppCodegen(),
    )
    assert _source(compiled).count("// piece:") == 3


def test_padding_is_split_into_its_border_and_inside():
    x = torch.randn(6, 40)
    compiled = check_against_eager(
        lambda a: F.pad(a.tanh(), (3, 5), value=-1.5) + 1, [x], codegen=CppCodegen()
    )
    assert _source(compiled).count("// piece:") == 3


def test_integer_cat_and_an_index_out_of_range_still_raises():
    x, i = torch.randint(-9, 9, (20,)), torch.randint(0, 20, (30,))
    check_against_eager(lambda a, i: torch.cat([a[i], a * 2]), [x, i], codegen=CppCodegen())
    compiled = check_against_eager(
        lambda a, i: torch.cat([a[i], a * 2]), [x, i], codegen=CppCodegen()
    )
    with pytest.raises(IndexError):
        compiled(x, torch.full((30,), 25))


def test_sizes_that_change_are_not_split():
    x, y = torch.randn(10, 8), torch.randn(12, 8)
    compiled = check_against_eager(
        lambda a, b: torch.cat([a, b.sin()]),
        [x, y],
        codegen=CppCodegen(),
        dynamic=True,
        run_inputs=[torch.randn(7, 8), torch.randn(3, 8)],
    )
    assert "// piece:" not in _source(compiled)


def test_facts_decide_comparisons_inside_bounds_only():
    x = sympy.Symbol("x0", integer=True, nonnegative=True)
    facts = IndexFacts({x: (4, 10)})
    facts.index_value("i", x)
    facts.constant("four", 4)
    facts.constant("ten", 10)
    facts.constant("seven", 7)
    assert facts.decide("ge", ("i", "four")) is True
    assert facts.decide("lt", ("i", "ten")) is True
    assert facts.decide("lt", ("i", "four")) is False
    assert facts.decide("lt", ("i", "seven")) is None  # 7 is inside the piece
    assert facts.decide("gt", ("ten", "i")) is True
    facts.known["t"] = True
    assert facts.decide("logical_and", ("t", "b")) == "b"
    assert facts.decide("logical_or", ("t", "b")) is True
    assert facts.cuts[x] == {4, 7, 10}


def test_pieces_take_the_innermost_static_loop_and_no_more_than_the_limit():
    x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
    ranges = [sympy.Integer(8), sympy.Integer(100)]
    assert pieces({x0: {3}, x1: {0, 40, 100}}, [x0, x1], ranges) == (1, [(0, 40), (40, 100)])
    assert pieces({x0: {3}}, [x0, x1], ranges) == (0, [(0, 3), (3, 8)])
    assert pieces({x1: set(range(1, MAX_PIECES + 2))}, [x0, x1], ranges) is None
    assert pieces({x1: {5}}, [x0, x1], [sympy.Integer(8), sympy.Symbol("s0")]) is None
