"""Long float sums add in float lanes in a cascade (``kiln::CascadeLanes``), as eager's
cascade sum does: on fresh values of mixed sign and magnitude, kiln-cpp's error against a
float64 sum is no worse than a small multiple of eager's, for full, row and column sums, at
one and two threads."""

import numpy as np
import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_cpp.codegen import CppKernel
from kiln_loopir.testing import compile_fn


def _mixed(shape, offset=0.0, seed=0):
    """Values of both signs over about six orders of magnitude, plus ``offset``."""
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.exp(torch.randn(shape, generator=g, dtype=torch.float64) * 2)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * magnitude + offset).float()


def _compiled(fn, example, dynamic=False):
    codegen = CppCodegen()
    compiled = compile_fn(fn, [example], codegen=codegen, dynamic=dynamic)
    (kernel,) = [k for k in compiled.kernels if "kiln::CascadeLanes<" in k.source]
    assert isinstance(kernel.fn, CppKernel), kernel.fn
    assert "omp simd reduction(+:" not in kernel.source  # no sum in double lanes
    return compiled


def _assert_as_accurate_as_eager(got, want, reference, times=4):
    """Each output's error against ``reference`` (float64) within ``times`` eager's, or
    two float ulps of the reference (where eager happens to round exactly)."""
    spacing = np.spacing(np.abs(reference.float().numpy().reshape(-1)))  # a float's ulp
    ulp = torch.from_numpy(spacing).reshape(reference.shape).double()
    bound = times * (want.double() - reference).abs() + 2 * ulp
    error = (got.double() - reference).abs()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert bool((error <= bound).all()), (error - bound).max()


@pytest.mark.parametrize("n", [10**6, 10**7])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_full_sums_of_mixed_values(threads, n, offset):
    compiled = _compiled(lambda a: a.sum(), _mixed(n))
    x = _mixed(n, offset, seed=1)  # fresh values
    _assert_as_accurate_as_eager(compiled(x)[0], x.sum(), x.double().sum())


def test_long_rows_and_their_mean(threads):
    compiled = _compiled(lambda a: a.sum(-1), _mixed((4, 1 << 20)))
    x = _mixed((4, 1 << 20), 0.5, seed=2)
    _assert_as_accurate_as_eager(compiled(x)[0], x.sum(-1), x.double().sum(-1))
    compiled = _compiled(lambda a: a.mean(-1), _mixed((3, 1_000_003)))
    x = _mixed((3, 1_000_003), seed=3)
    _assert_as_accurate_as_eager(compiled(x)[0], x.mean(-1), x.double().mean(-1))


@pytest.mark.parametrize("shape", [(4096, 512), (200_003, 16), (30_000, 70)])
def test_long_columns(threads, shape):
    compiled = _compiled(lambda a: a.sum(0), _mixed(shape))
    x = _mixed(shape, 0.25, seed=4)
    _assert_as_accurate_as_eager(compiled(x)[0], x.sum(0), x.double().sum(0))


def test_symbolic_sizes_take_their_cascade_step_when_they_run():
    compiled = _compiled(lambda a: a.sum(-1), _mixed((2, 5000)), dynamic=True)
    for shape in [(2, 5000), (3, 2_000_001)]:
        x = _mixed(shape, seed=5)
        _assert_as_accurate_as_eager(compiled(x)[0], x.sum(-1), x.double().sum(-1))


def test_double_and_bfloat16_sums():
    compiled = _compiled(lambda a: a.sum(-1), torch.randn(3, 300_000, dtype=torch.float64))
    x = torch.randn(3, 300_000, dtype=torch.float64)
    torch.testing.assert_close(compiled(x)[0], x.sum(-1), rtol=1e-12, atol=1e-9)
    compiled = _compiled(lambda a: a.sum(-1), torch.randn(3, 300_000).bfloat16())
    x = (torch.randn(3, 300_000) + 0.5).bfloat16()  # added in float lanes, as eager adds
    torch.testing.assert_close(compiled(x)[0], x.sum(-1), rtol=8e-3, atol=1.0)
