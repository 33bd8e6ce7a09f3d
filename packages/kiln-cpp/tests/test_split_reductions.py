"""Full and column reductions split across threads (``kiln_cpp.split``): equal to eager at
one and two threads, on fresh random inputs, with the partials combined in a fixed order."""

import math

import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_cpp.codegen import CppKernel
from kiln_cpp.split import SPLIT_MIN_POINTS
from kiln_loopir.testing import compile_fn


def _split_kernel(compiled, codegen):
    """The split kernel, after checking kiln-cpp built it into the library it loaded."""
    (kernel,) = [k for k in compiled.kernels if "kiln::split_chunks(" in k.source]
    assert isinstance(kernel.fn, CppKernel), kernel.fn
    assert codegen.builds + codegen.cache_hits == 1 and codegen.last_library.exists()
    return kernel


def _fresh(x):
    stats = x.double()
    return (torch.randn_like(stats) * stats.std() + stats.mean()).to(x.dtype)


def _check(fn, inputs, expect_split=True, rtol=1e-5):
    codegen = CppCodegen()
    compiled = compile_fn(fn, inputs, codegen=codegen)
    # fresh values of the same mean and spread as the example's
    fresh = [_fresh(x) if x.is_floating_point() else x for x in inputs]
    got, want = compiled(*fresh), fn(*fresh)
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=rtol, atol=1e-6, equal_nan=True)
    if expect_split:
        _split_kernel(compiled, codegen)
    else:
        assert all("kiln::split_chunks(" not in k.source for k in compiled.kernels)
    return compiled, fresh


@pytest.mark.parametrize("n", [1 << 20, 1_000_003])  # chunks of equal and unequal length
def test_full_float_sum(threads, n):
    _check(lambda a: (a.sum(), a.mean()), [torch.randn(n) + 0.5])


def test_full_max_min_and_a_nan_in_the_last_chunk(threads):
    x = torch.randn(1 << 20)
    _check(lambda a: (a.amax(), a.amin()), [x])
    compiled, _ = _check(lambda a: a.amax(), [x])
    x[-3] = math.nan
    assert torch.isnan(compiled(x)[0])


def test_full_product_any_all_and_integer_sum(threads):
    x = 1 + torch.randn(300_000) * 1e-4
    # eager multiplies in float (about 4e-4 off after 300000 factors), kiln-cpp in double
    compiled, (fresh,) = _check(lambda a: a.prod(), [x], rtol=1e-3)
    torch.testing.assert_close(
        compiled(fresh)[0].double(), fresh.double().prod(), rtol=1e-6, atol=0
    )
    i = torch.randint(-1000, 1000, (400_000,))
    compiled, _ = _check(lambda a: a.sum(), [i])
    assert compiled(i)[0].item() == i.sum().item()
    b = torch.randn(400_000)
    compiled, _ = _check(lambda a: ((a > 4.5).any(), (a > -6).all()), [b])
    b[-5] = 10.0
    assert compiled(b)[0].item() is True


def test_full_welford_statistics_combine_their_chunks(threads):
    x = torch.randn(1_000_003) * 3 + 50  # an offset mean: Chan's merge must keep m2 exact
    _check(lambda a: torch.var_mean(a), [x])
    _check(lambda a: (a.std(), a.var(correction=0)), [torch.randn(1000, 301)])
    _check(lambda a: torch.var_mean(a[:, ::2]), [torch.randn(700, 401)])  # lanes inside r1


def test_sums_in_lanes_add_their_lanes_into_the_chunks_partial(threads):
    _check(lambda a: a.sum(), [torch.randn(300_001, dtype=torch.float64)])
    _check(lambda a: a.sum(0), [torch.randn(65536, 16, dtype=torch.float64)])


def test_full_sum_of_a_strided_view_splits_its_first_reduction_dim(threads):
    x = torch.randn(1024, 257) + 0.5
    _check(lambda a: a[:, ::2].sum(), [x])


@pytest.mark.parametrize("shape", [(65536, 16), (40_000, 21)])
def test_tall_column_sums(threads, shape):
    _check(lambda a: (a.sum(0), a.amax(0), (a > 3.9).amax(0)), [torch.randn(shape) + 0.5])


def test_column_sum_over_a_middle_dimension(threads):
    _check(lambda a: a.sum(1) * 2, [torch.randn(3, 30_000, 5) + 0.5])


def test_symbolic_sizes_choose_their_chunks_when_they_run(threads):
    for fn, shapes in (
        (lambda a: a.sum(), [(300_000,), (200_001,)]),
        (lambda a: a.sum(0), [(50_000, 7), (70_001, 9)]),
    ):
        first, second = (torch.randn(shape) + 0.5 for shape in shapes)
        codegen = CppCodegen()
        compiled = compile_fn(fn, [first], codegen=codegen, dynamic=True)
        _split_kernel(compiled, codegen)
        for x in (first, second):
            torch.testing.assert_close(compiled(x)[0], fn(x), rtol=1e-5, atol=1e-6)


def test_the_same_result_every_call(threads):
    x = torch.randn(1 << 20) + 0.5
    compiled, _ = _check(lambda a: a.sum(), [x])
    first = compiled(x)[0]
    assert all(torch.equal(compiled(x)[0], first) for _ in range(20))


def test_small_and_wide_reductions_keep_their_serial_form(threads):
    _check(lambda a: a.sum(), [torch.randn(2 * SPLIT_MIN_POINTS - 1) + 0.5], expect_split=False)
    # 64 blocks of columns (of 64) occupy 64 threads: never split
    _check(lambda a: a.sum(0), [torch.randn(128, 4096) + 0.5], expect_split=False)
    # a small product by columns: 16 units of 4096 points, less than two chunks each
    weight = torch.randn(64, 64) / 8
    _check(lambda x, w: (x[:, :, None] * w).sum(1), [torch.randn(16, 64), weight],
           expect_split=False, rtol=1e-4)  # fmt: skip


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda a: a.sum(-1), (3, 1 << 20)),  # rows not a multiple of the threads
        (lambda a: (a.mean(-1), a.amax(-1), a.amin(-1)), (5, 200_003)),
        (lambda a: torch.var_mean(a, -1), (3, 300_001)),
        (lambda a: a.sum(-1), (2, 3, 100_000)),  # two outer dimensions
        (lambda a: a[:, ::2].sum(-1), (3, 600_001)),  # strided rows
    ],
)
def test_few_long_rows(threads, fn, shape):
    _check(fn, [torch.randn(shape) * 2 + 5])  # an offset: Chan's merge must keep m2 exact


def test_row_splits_give_the_same_result_every_call(threads):
    x = torch.randn(3, 1 << 20) + 0.5
    compiled, _ = _check(lambda a: a.sum(-1), [x])
    first = compiled(x)[0]
    assert all(torch.equal(compiled(x)[0], first) for _ in range(20))


def test_many_or_short_rows_and_argmax_keep_their_serial_form(threads):
    _check(lambda a: a.sum(-1), [torch.randn(64, 4096) + 0.5], expect_split=False)
    _check(lambda a: a.sum(-1), [torch.randn(3, 20_000) + 0.5], expect_split=False)
    _check(lambda a: a.argmax(-1), [torch.randn(3, 1 << 20)], expect_split=False)
    # a symbolic number of rows may be many: no split, whatever the size it runs at
    codegen = CppCodegen()
    compiled = compile_fn(lambda a: a.sum(-1), [torch.randn(3, 100_000)], codegen=codegen,
                          dynamic=True)  # fmt: skip
    assert all("kiln::split_chunks(" not in k.source for k in compiled.kernels)
    x = torch.randn(5, 70_001)
    torch.testing.assert_close(compiled(x)[0], x.sum(-1), rtol=1e-5, atol=1e-4)
