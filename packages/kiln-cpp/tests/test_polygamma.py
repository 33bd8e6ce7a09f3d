"""polygamma in C++ kernels equals ATen's at every order kind (digamma, trigamma, Hurwitz
zeta), at its poles, past them, at large values, inf and NaN, in float32 and float64."""

import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_loopir.ir import ExternNode
from kiln_loopir.testing import check_against_eager

EDGES = [0.0, -0.0, -1.0, -2.0, -7.0, -2.5, -0.5, 0.5, 1e-3, 1e-30, 1e30, 3.0, 9.0, 1e5]
EDGES += [-10.3, -100.7, float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_polygamma_matches_eager(dtype):
    x = torch.cat([torch.tensor(EDGES), torch.randn(40) * 5, torch.rand(8) * 200]).to(dtype)
    compiled = check_against_eager(
        lambda v: [torch.polygamma(n, v) for n in (0, 1, 2, 3, 4, 7, 12)],
        [x],
        codegen=CppCodegen(),
    )
    assert not [s for s in compiled.schedule.steps if isinstance(s, ExternNode)]


def test_zeta_matches_eager():
    s = torch.cat([torch.tensor([1.0, 0.5, 2.0, 3.0, 2.5]), torch.rand(20) * 6 + 1])
    q = torch.cat([torch.tensor([1.0, 1.0, 0.0, -2.5, -2.5]), torch.randn(20) * 4])
    check_against_eager(torch.special.zeta, [s, q], codegen=CppCodegen())
