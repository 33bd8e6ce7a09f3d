"""Float powers by the exponents ATen computes without pow lower to multiplications and
roots (no pow in the kernel) and agree with eager; other exponents keep pow."""

import pytest
import torch

from kiln_loopir.testing import check_against_eager

POWERS = [0.5, 1, 2, 3.0, -0.5, -1, -2.0]


@pytest.mark.parametrize("exponent", POWERS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_power_is_computed_without_pow(exponent, dtype):
    x = (torch.rand(6, 33) * 3 + 0.1).to(dtype)  # positive: roots of negatives are NaN
    x[0, :4] = torch.tensor([0.0, float("inf"), float("nan"), 1e-3])
    compiled = check_against_eager(lambda v: v**exponent, [x])
    graph = str(compiled.graph)
    assert "pow(" not in graph, graph


def test_negative_bases_keep_their_sign():
    x = torch.randn(5, 7)
    compiled = check_against_eager(lambda v: (v**3, v**2, v**1.0, v**-1, v**-2), [x])
    assert "pow(" not in str(compiled.graph)


@pytest.mark.parametrize("exponent", [1.5, 4, -3.0], ids=str)
def test_other_exponents_keep_pow(exponent):
    x = torch.rand(4, 9) + 0.5
    compiled = check_against_eager(lambda v: v**exponent, [x])
    assert "pow(" in str(compiled.graph)


def test_integer_tensors_keep_integer_pow():
    x = torch.randint(-5, 6, (4, 9))
    check_against_eager(lambda v: v**3, [x])
