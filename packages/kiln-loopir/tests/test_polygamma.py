"""polygamma lowers to pointwise kernels (digamma, trigamma, Hurwitz zeta), no extern
call left, and agrees with eager at its poles, past them and at inf and NaN."""

import pytest
import torch

from kiln_loopir.ir import ExternNode
from kiln_loopir.testing import check_against_eager

EDGES = [0.0, -0.0, -1.0, -2.0, -2.5, -0.5, 0.5, 1e-30, 1e30, 3.0, 1e5, -10.3, -100.7]
EDGES += [float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_polygamma_is_pointwise_and_matches_eager(dtype):
    x = torch.cat([torch.tensor(EDGES), torch.randn(16) * 4]).to(dtype)
    compiled = check_against_eager(
        lambda v: [torch.polygamma(n, v) for n in (0, 1, 2, 3, 4, 7)], [x], codegen="reference"
    )
    assert not [s for s in compiled.schedule.steps if isinstance(s, ExternNode)]


def test_special_zeta_is_pointwise():
    s, q = torch.rand(4, 5) * 4 + 0.5, torch.randn(4, 5) * 3
    compiled = check_against_eager(torch.special.zeta, [s, q], codegen="reference")
    assert not [step for step in compiled.schedule.steps if isinstance(step, ExternNode)]
