"""Column kernels of several passes (``kiln_cpp.columns``): a channels-last batch norm's
per-channel statistics (a Welford, or sums) reduced with one channel per vector lane, then
the rows walked again to normalise, equal to eager at one and two threads on fresh random
inputs, for channel counts that leave a partial block of lanes and row counts that are no
multiple of the vector width."""

import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_loopir.testing import compile_fn

CHANNELS = [3, 17, 64, 100]
# rows (batch x height x width): 70, and 69564 (enough points to split across threads)
SIZES = [(2, 5, 7), (4, 31, 33)]
EPS = 1e-5


def _channels_last(n: int, c: int, h: int, w: int, mean: float = 0.0) -> torch.Tensor:
    x = torch.randn(n, c, h, w) * 2 + mean
    return x.contiguous(memory_format=torch.channels_last)


def _forward(x, weight, bias):
    out, mean, invstd = torch.ops.aten.native_batch_norm(
        x, weight, bias, None, None, True, 0.1, EPS
    )
    return out.relu(), mean, invstd


def _backward(grad, x, weight, mean, invstd):
    return torch.ops.aten.native_batch_norm_backward(
        grad, x, weight, None, None, mean, invstd, True, EPS, [True, True, True]
    )


def _assert_as_eager(got, fn, inputs):
    """``got`` equal to eager's ``fn(*inputs)`` within float tolerances plus eager's own
    distance from the float64 result: statistics of 69564 rows in float differ by the
    order of their additions (kiln's were 5-10x closer to float64 than eager's)."""
    want, exact = fn(*inputs), fn(*[t.double() for t in inputs])
    for g, w, e in zip(got, want, exact, strict=True):
        eager_error = (w.double() - e).abs().max().item()
        torch.testing.assert_close(g, w, rtol=1.3e-5, atol=1e-5 + 2 * eager_error)
        assert g.stride() == w.stride()


def _compiled_source(fn, inputs):
    codegen = CppCodegen()
    compiled = compile_fn(fn, inputs, codegen=codegen)
    return compiled, "\n".join(k.source for k in compiled.kernels)


def _forward_inputs(c, size, mean=0.0):
    n, h, w = size
    return [_channels_last(n, c, h, w, mean), torch.randn(c) + 1, torch.randn(c)]


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("size", SIZES, ids=["70-rows", "69564-rows"])
def test_channels_last_batch_norm_forward(threads, c, size):
    compiled, source = _compiled_source(_forward, _forward_inputs(c, size))
    # each lane keeps one channel's Welford, the normalising pass reads its statistics
    assert "kiln::WelfordColumns<" in source and "_kept[" in source
    fresh = _forward_inputs(c, size, mean=3.0)  # an offset mean: the lanes must keep m2
    _assert_as_eager(compiled(*fresh), _forward, fresh)


def _backward_inputs(c, size):
    x, weight, _ = _forward_inputs(c, size, mean=1.0)
    _, mean, invstd = _forward(x, weight, torch.zeros(c))
    grad = torch.randn_like(x)
    return [grad, x, weight, mean, invstd]


@pytest.mark.parametrize("c", CHANNELS)
@pytest.mark.parametrize("size", SIZES, ids=["70-rows", "69564-rows"])
def test_channels_last_batch_norm_backward(threads, c, size):
    compiled, source = _compiled_source(_backward, _backward_inputs(c, size))
    # the sums of grad and grad * (x - mean) per lane, then the input gradient's pass
    assert "_kept[x0" in source and "_lanes" in source
    fresh = _backward_inputs(c, size)
    _assert_as_eager(compiled(*fresh), _backward, fresh)


def test_a_spilled_value_is_computed_again_in_the_later_pass():
    # grad * mask is read by both passes: recomputed in the second, never kept per row
    def fn(grad, mask, x, weight, mean, invstd):
        return _backward(torch.where(mask, 0.0, grad), x, weight, mean, invstd)

    grad, x, weight, mean, invstd = _backward_inputs(17, (3, 9, 11))
    mask = torch.randn_like(x) > 0
    compiled, source = _compiled_source(fn, [grad, mask, x, weight, mean, invstd])
    assert "_spill" not in source and "_kept[" in source
    fresh = [torch.randn_like(grad), torch.randn_like(x) > 0, x, weight, mean, invstd]
    for g, w in zip(compiled(*fresh), fn(*fresh), strict=True):
        torch.testing.assert_close(g, w, rtol=1.3e-5, atol=1e-5)


def test_contiguous_batch_norm_keeps_its_row_kernels():
    x = torch.randn(2, 17, 5, 7)
    _, source = _compiled_source(_forward, [x, torch.randn(17), torch.randn(17)])
    assert "_kept[" not in source and "WelfordColumns<" not in source
