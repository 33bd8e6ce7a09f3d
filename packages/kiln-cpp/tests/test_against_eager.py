"""Functions compiled to C++ kernels equal eager on fresh random inputs."""

import pytest
import torch
import torch.nn.functional as F

from kiln_cpp import CppCodegen
from kiln_loopir.testing import check_against_eager, check_sizes
from kiln_loopir.testing.cases import SIZE_FAMILIES


def _f(*shape):
    return torch.randn(*shape)


def _i(*shape):
    return torch.randint(-50, 50, shape)


def _nonzero_i(*shape):
    x = torch.randint(1, 9, shape)
    return torch.where(torch.rand(shape) < 0.5, -x, x)


CASES = {
    "pointwise_chain": (
        lambda a, b: torch.sigmoid((a * 2 + b).relu()) - a.exp(),
        lambda: [_f(8, 16), _f(8, 16)],
    ),
    "broadcast_add": (lambda a, b: a + b, lambda: [_f(4, 1, 8), _f(3, 1)]),
    "where_clamp": (
        lambda a, b: torch.where(a > 0, a, b).clamp(-0.5, 0.5),
        lambda: [_f(6, 10), _f(6, 10)],
    ),
    "casts": (
        lambda a, b: (
            (a * 10).to(torch.int64) * 3,
            (a > 0) & (b < 0),
            (b > 0).to(torch.float32) + a,
        ),
        lambda: [_f(5, 7), _f(5, 7)],
    ),
    "int_floor_div_mod": (
        lambda a, b: (
            torch.div(a, b, rounding_mode="floor"),
            torch.remainder(a, b),
            a // 7 - a % 5,
        ),
        lambda: [_i(6, 9), _nonzero_i(6, 9)],
    ),
    "float_floor_div_mod": (
        lambda a, b: (torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b)),
        lambda: [_f(6, 9) * 5, _f(6, 9)],
    ),
    "softmax": (lambda a: torch.softmax(a, -1), lambda: [_f(8, 33)]),
    "log_softmax_dim0": (lambda a: torch.log_softmax(a, 0), lambda: [_f(12, 5)]),
    "layernorm": (
        lambda a, w, b: F.layer_norm(a, (24,), w, b),
        lambda: [_f(6, 24), _f(24), _f(24)],
    ),
    "sum_max_rows": (lambda a: (a.sum(-1), a.amax(-1), a.mean(-1)), lambda: [_f(7, 13)]),
    "sum_min_cols": (lambda a: (a.sum(0), a.amin(0), a.prod(0)), lambda: [_f(5, 11)]),
    "var_argmax": (lambda a: (a.var(-1), a.argmax(-1), a.argmin(0)), lambda: [_f(6, 10)]),
    "full_sum": (lambda a: a.sum() + a.max(), lambda: [_f(9, 14)]),
    "int_and_bool_reductions": (
        lambda a: (a.sum(-1), a.amax(0), (a > 0).any(-1), (a > -40).all(0)),
        lambda: [_i(6, 8)],
    ),
    "non_contiguous": (lambda a, b: a.t() * 2 + b[:, ::2], lambda: [_f(12, 6), _f(6, 24)]),
    "cat_pad": (
        lambda a, b: F.pad(torch.cat([a, b], 1), (1, 2), value=-1.5),
        lambda: [_f(4, 5), _f(4, 3)],
    ),
    "gather": (
        lambda a, i: torch.gather(a, 1, i),
        lambda: [_f(5, 9), torch.randint(0, 9, (5, 4))],
    ),
    "index_negative": (lambda a, i: a[i] * 2, lambda: [_f(5, 3), torch.randint(-5, 5, (7,))]),
    "index_put_accumulate": (
        lambda z, i, v: z.index_put((i,), v, accumulate=True),
        lambda: [_f(10), torch.randint(0, 10, (40,)), _f(40)],
    ),
    "int8_wraps": (
        lambda a: (a * 3 + a, a.sum(-1), a // 3),
        lambda: [torch.randint(-100, 100, (6, 7), dtype=torch.int8)],
    ),
    "slice_scatter_step": (
        lambda x, s: torch.slice_scatter(x, s, 1, 1, 7, 2),
        lambda: [_f(3, 8), _f(3, 3)],
    ),
    "float64_int32_uint8": (
        lambda a, b, c: (a.exp() / 3 + a.sum(-1, keepdim=True), b * 2 - 7, b.sum(0), c + c),
        lambda: [
            _f(4, 6).double(),
            _i(4, 6).int(),
            torch.randint(0, 255, (4, 6), dtype=torch.uint8),
        ],
    ),
    "erfinv_digamma": (
        lambda a, b: (torch.erfinv(a), torch.digamma(b)),
        lambda: [
            torch.rand(64) * 1.98 - 0.99,
            torch.cat([torch.rand(32) * 20 + 0.01, torch.rand(16) * -5 - 0.01]),
        ],
    ),
    "reductions_over_nothing": (
        lambda a: (*torch.var_mean(a, -1), a.sum(-1), a.mean(-1)),
        lambda: [_f(3, 0)],
    ),
    "bfloat16": (
        lambda a, b: (a * b + 1).softmax(-1),
        lambda: [_f(4, 16).bfloat16(), _f(4, 16).bfloat16()],
    ),
    "float16": (lambda a: a.sum(-1) * 2, lambda: [_f(4, 16).half()]),
    "scans": (
        lambda a: (
            torch.cumsum(a, 0),
            torch.cumprod(a * 0.01 + 1, 1),
            torch.logcumsumexp(a, 1),
            *torch.cummax(a, 0),
            torch.cummin(a, 1).indices,
        ),
        lambda: [_with_nans_and_ties(_f(7, 150))],
    ),
    "scans_of_a_producer_in_blocks": (  # 150 steps: three blocks of values, the last short
        lambda a: (torch.cumsum(a.sin(), 1), *torch.cummin(a.exp(), 1), torch.cumsum(a.cos(), 0)),
        lambda: [_with_nans_and_ties(_f(7, 150))],
    ),
    "scan_bfloat16_and_int": (
        lambda a, i: (torch.cumsum(a, 1), torch.cumsum(i, 0), torch.cummax(i, 1).indices),
        lambda: [_f(3, 70).bfloat16(), torch.randint(-3, 3, (5, 9))],
    ),
}


def _with_nans_and_ties(a):
    a[2, 5] = a[3, 100] = float("nan")  # a NaN stays in every scan after it
    a[1, :4] = 0.5  # ties: cummax/cummin take the latest
    a[4, 7] = float("-inf")
    return a


@pytest.mark.filterwarnings("ignore:var_mean.*degrees of freedom")  # eager's, on no elements
@pytest.mark.parametrize("name", sorted(CASES))
def test_against_eager(name):
    fn, make_inputs = CASES[name]
    check_against_eager(fn, make_inputs(), codegen=CppCodegen())


def test_parallel_kernel():
    """A kernel over enough points runs its outer loop under OpenMP."""
    compiled = check_against_eager(
        lambda a: torch.softmax(a * 3, -1), [_f(256, 160)], codegen=CppCodegen()
    )
    assert "#pragma omp parallel for" in compiled.kernels[0].source


def test_symbolic_sizes_run_at_other_sizes():
    compiled = check_against_eager(
        lambda a: torch.softmax(a, -1) + a.sum(0),
        [_f(8, 16)],
        codegen=CppCodegen(),
        dynamic=True,
        run_inputs=[_f(5, 7)],
    )
    assert "int64_t s" in compiled.kernels[0].source  # sizes are kernel arguments


@pytest.mark.parametrize("name", sorted(SIZE_FAMILIES))
def test_one_build_runs_at_every_size_of_a_family(name):
    family = SIZE_FAMILIES[name]
    compiled = check_sizes(family.fn, family.inputs, family.sizes, codegen=CppCodegen())
    assert compiled.graph.size_hints, "compiled with symbolic sizes"


def test_random_numbers_match_the_reference_codegen():
    """Same seed, same counter-based hash: the values equal the reference codegen's."""
    from kiln_loopir.testing import compile_fn

    x = _f(32, 48)

    def fn(a):
        return torch.rand_like(a) + a, torch.randn_like(a)

    cpp, ref = compile_fn(fn, [x], codegen=CppCodegen()), compile_fn(fn, [x])
    torch.manual_seed(7)
    got = cpp(x)
    torch.manual_seed(7)
    want = ref(x)
    torch.testing.assert_close(got, want)
    u = got[0] - x
    assert float(u.min()) >= 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.05


def test_out_of_range_index_raises():
    x, i = _f(5, 3), torch.tensor([0, 4, 9])
    compiled = check_against_eager(lambda a, j: a[j] + 1, [x, torch.tensor([0, 1, -5])],
                                   codegen=CppCodegen())  # fmt: skip
    with pytest.raises(IndexError, match="out of range"):
        compiled(x, i)
