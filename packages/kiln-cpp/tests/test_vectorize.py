"""The vectorised loop shapes (``kiln_cpp.vectorize``) against eager, at sizes that leave
tails (not a multiple of the lanes or tiles) and with NaNs where lanes must carry them."""

import math

import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_cpp.codegen import CppKernel
from kiln_loopir.testing import check_against_eager, compile_fn


def _with_nans(x: torch.Tensor, every: int) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[::every] = math.nan
    return x


def _source(compiled) -> str:
    return "\n".join(k.source for k in compiled.kernels)


def test_row_reductions_reduce_across_lanes():
    x = torch.randn(37, 203)
    compiled = check_against_eager(
        lambda a: (a.sum(-1), a.amax(-1), a.amin(-1), a.prod(-1) * 0 + 1), [x], codegen=CppCodegen()
    )
    # the float sum adds in lanes of its own, the others through clauses
    assert "_lanes[r0 - r0_block] += " in _source(compiled)
    assert "reduction(max:" in _source(compiled)


def test_max_and_min_propagate_a_nan_in_any_lane():
    x = torch.randn(9, 77)
    x[2, 5] = x[4, 76] = x[7, 0] = math.nan  # a lane in the middle, the tail, the first
    check_against_eager(
        lambda a: (a.amax(-1), a.amin(-1), a.softmax(-1)), [x], codegen=CppCodegen()
    )


def test_int_and_bool_reductions_under_simd():
    x = torch.randint(-50, 50, (13, 45))
    check_against_eager(
        lambda a: (a.sum(-1), a.amax(-1), (a > 0).any(-1), (a > -49).all(-1)),
        [x],
        codegen=CppCodegen(),
    )


def test_sums_shorter_than_a_block_of_lanes_reduce_with_a_clause():
    """A float sum over 16 points: no block of 32 lanes would run, so no lane array, no tree
    of adds; one ``omp simd`` loop with a ``reduction(+:...)`` clause."""
    x, y = torch.randn(64, 16), torch.randn(48, 16)
    compiled = check_against_eager(
        lambda a, b: (a @ b.t(), a.sum(-1)), [x, y], codegen=CppCodegen()
    )
    source = _source(compiled)
    assert "_lanes[" not in source
    assert "reduction(+:" in source


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100, 1000])
def test_welford_lanes_and_tail(n):
    x = torch.randn(5, n) * 3 + 50  # an offset mean: the lanes' merge must keep m2 exact
    compiled = check_against_eager(
        lambda a: torch.var_mean(a, -1, correction=0), [x], codegen=CppCodegen()
    )
    source = _source(compiled)
    if n == 1:
        return  # no reduction loop at all
    if n < 32:  # shorter than a block of lanes: one scalar loop
        assert "WelfordLanes" not in source and source.count(".update(") == 1
        return
    assert "WelfordLanes" in source and "merge" in source
    # var and mean of one var_mean share one pass over the data and one accumulator
    assert source.count(".update(") == 2  # the lanes' update and the tail's


@pytest.mark.parametrize("n", [64, 256, 4099])
def test_welford_lanes_merge_at_once_against_float64(n):
    # a far offset and a small spread: the lanes' means differ by little, the m2 is small
    compiled = compile_fn(
        lambda a: torch.var_mean(a, -1), [torch.randn(16, n)], codegen=CppCodegen()
    )
    assert isinstance(compiled.kernels[0].fn, CppKernel)
    assert "kiln::WelfordLanes<32, float>" in compiled.kernels[0].source
    x = torch.randn(16, n) * 0.01 + 1000
    (var, mean), (var64, mean64) = compiled(x), torch.var_mean(x.double(), -1)
    torch.testing.assert_close(mean.double(), mean64, rtol=1e-7, atol=0)
    # the lanes keep their means in float (ulp 6e-5 near 1000, against a spread of 0.01):
    # about 1e-3 of the variance is lost there, before and after the merge (eager: 5e-8)
    torch.testing.assert_close(var.double(), var64, rtol=5e-3, atol=0)


def test_welford_over_several_reduction_dims_and_a_nan():
    x = torch.randn(3, 7, 45)
    check_against_eager(lambda a: torch.var_mean(a, (0, 2)), [x], codegen=CppCodegen())
    check_against_eager(lambda a: torch.var(a, -1), [_with_nans(x, 17)], codegen=CppCodegen())


def test_layer_norm_with_odd_rows():
    x, w, b = torch.randn(6, 91), torch.randn(91), torch.randn(91)
    check_against_eager(
        lambda a, w, b: torch.nn.functional.layer_norm(a, (91,), w, b), [x, w, b],
        codegen=CppCodegen(),
    )  # fmt: skip


@pytest.mark.parametrize("shape", [(70, 19), (5, 300)])
def test_column_reductions_run_lanes_over_columns(shape):
    x = _with_nans(torch.randn(shape), 23)
    compiled = check_against_eager(
        lambda a: (a.sum(0), a.amax(0), a.amin(0)), [x], codegen=CppCodegen()
    )
    assert "_lanes[" in _source(compiled)


def test_column_sum_over_a_middle_dimension():
    check_against_eager(lambda a: a.sum(1) * 2, [torch.randn(3, 50, 21)], codegen=CppCodegen())


@pytest.mark.parametrize("shape", [(45, 70), (33, 33)])
def test_transposing_pointwise_kernels_run_in_tiles(shape):
    x, y = torch.randn(shape), torch.randn(shape[::-1])
    compiled = check_against_eager(lambda a, b: a.t() + b, [x, y], codegen=CppCodegen())
    assert "_tile" in _source(compiled)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_whole_tiles_are_transposed_in_blocks(dtype):
    x = torch.randn(128, 192).mul(100).to(dtype)
    y = torch.randn(192, 128).mul(100).to(dtype)
    compiled = check_against_eager(lambda a, b: a.t() + b * 3, [x, y], codegen=CppCodegen())
    source = _source(compiled)
    assert "_tile0_block[8][8];" in source and "#pragma GCC unroll 8" in source


def test_transposing_batched_kernel():
    x, y = torch.randn(3, 40, 17), torch.randn(3, 17, 40)
    check_against_eager(lambda a, b: a.transpose(1, 2) * b + 1, [x, y], codegen=CppCodegen())


def test_pointwise_chain_with_vector_functions_and_a_tail():
    x = torch.randn(7, 45) * 5
    compiled = check_against_eager(
        lambda a: torch.sigmoid(a) * torch.tanh(a) + torch.erf(a) - torch.exp(a / 4),
        [x],
        codegen=CppCodegen(),
    )
    assert "#pragma omp simd" in _source(compiled)


def test_large_kernels_under_openmp():
    x = torch.randn(300, 257)
    check_against_eager(
        lambda a: (torch.softmax(a, -1), a.sum(0), a.t() * 2, torch.var_mean(a, -1)),
        [x],
        codegen=CppCodegen(),
    )


def test_indirect_indices_under_simd_still_raise():
    weight, ids = torch.randn(50, 64), torch.randint(-50, 50, (4, 9))
    index = torch.randint(-64, 64, (8, 40))

    def embed_norm(w, i):
        return torch.nn.functional.layer_norm(torch.nn.functional.embedding(i % 50, w), (64,))

    def gather(w, i):
        return torch.gather(w, 1, i % 64) * 2

    for fn, inputs in ((embed_norm, [weight, ids]), (gather, [weight, index])):
        compiled = check_against_eager(fn, inputs, codegen=CppCodegen())
        assert "#pragma omp simd" in _source(compiled)


def test_an_embedding_row_is_found_once_before_its_reduction_loop():
    def embed_add_norm(w, i, t, p):
        rows = torch.nn.functional.embedding(i, w) + torch.nn.functional.embedding(t, p)
        return torch.nn.functional.layer_norm(rows, (96,))

    weight, types = torch.randn(100, 96), torch.randn(2, 96)
    ids, kinds = torch.randint(0, 100, (3, 40)), torch.randint(0, 2, (3, 40))
    compiled = check_against_eager(embed_add_norm, [weight, ids, kinds, types],
                                   codegen=CppCodegen())  # fmt: skip
    (kernel,) = [k for k in compiled.kernels if "WelfordLanes" in k.source]
    before, loops = kernel.source.split("WelfordLanes")[:2]  # before the reduction loops
    assert before.count("__atomic_store_n(&kiln_oob") == 2  # the word's and the type's row
    assert "kiln_oob |=" not in loops and "reduction(|:kiln_oob" not in loops
    bad = ids.clone()
    bad[2, 7] = 100
    with pytest.raises(IndexError):
        compiled(weight, bad, kinds, types)
    # an index that moves with the reduction stays in its loop
    x, index = torch.randn(8, 300), torch.randint(0, 300, (8, 200))
    compiled = check_against_eager(lambda a, i: torch.gather(a, 1, i).sum(-1), [x, index],
                                   codegen=CppCodegen())  # fmt: skip
    assert "reduction(|:kiln_oob" in _source(compiled)


def test_out_of_range_gather_under_simd_raises():
    x, index = torch.randn(8, 64), torch.randint(0, 64, (8, 40))
    compiled = check_against_eager(lambda a, i: torch.gather(a, 1, i) * 2, [x, index],
                                   codegen=CppCodegen())  # fmt: skip
    assert "reduction(|:kiln_oob)" in _source(compiled)
    bad = index.clone()
    bad[5, 33] = 64
    with pytest.raises(IndexError):
        compiled(x, bad)


@pytest.mark.parametrize("n", [70, 5000])  # a per-point array on the stack, then the heap
def test_softmax_reuses_the_exponentials_of_its_sum(n):
    x = _with_nans(torch.randn(6, n), 997) if n > 100 else torch.randn(6, n)
    compiled = check_against_eager(lambda a: torch.softmax(a, -1), [x], codegen=CppCodegen())
    source = _source(compiled)
    last_read = source.rindex("_xs[r0]")  # the output loop reads the sum loop's values
    assert "kiln::exp_f(" in source and "kiln::exp_f(" not in source[last_read:]


def test_values_reused_across_welford_and_sum_loops():
    x = torch.randn(5, 77)

    def fn(a):
        e = torch.tanh(a) * 3
        var, mean = torch.var_mean(e, -1, keepdim=True)
        return (e - mean) / (var + 1) + torch.log_softmax(e, -1)

    check_against_eager(fn, [x], codegen=CppCodegen())


def test_layer_norm_of_a_sum_makes_one_pass_for_its_statistics():
    x, y, w = torch.randn(4, 9, 100), torch.randn(4, 9, 100), torch.randn(100)
    compiled = check_against_eager(
        lambda a, b, w: torch.nn.functional.layer_norm(a + b, (100,), w), [x, y, w],
        codegen=CppCodegen(),
    )  # fmt: skip
    source = _source(compiled)
    # mean and variance of the sum (stored per point for the output) in one Welford pass
    assert source.count("WelfordLanes<") == 1 and "_spill[" in source


@pytest.mark.parametrize("n", [64, 70, 1024, 4099])
def test_short_float_sums_add_in_float_lanes_and_long_ones_in_a_cascade(n):
    x = torch.randn(24, n) + 0.5  # an offset: the sum grows along the lanes
    compiled = check_against_eager(
        lambda a: (a.sum(-1), (a * a).mean(-1)), [x], codegen=CppCodegen()
    )
    source = _source(compiled)
    assert "omp simd reduction(+:" not in source
    if n <= 1024:
        assert "float acc" in source and "double acc" not in source
        assert "_lanes[32] = {};" in source and "_lanes[kiln_l + 16];" in source
    else:  # float lanes in a cascade; the double accumulator takes their total and the tail
        assert source.count("kiln::CascadeLanes<32, float>") == 2
        assert ".level[0][r0 - r0_block] += " in source and ".next_block();" in source
