"""Functions compiled to Triton kernels equal eager on fresh random inputs (under the
interpreter on CPU tensors without a GPU, on the GPU with one)."""

import pytest
import torch
import torch.nn.functional as F

from kiln_loopir.lowering import matmul
from kiln_loopir.testing import check_against_eager, check_sizes, compile_fn
from kiln_loopir.testing.cases import SIZE_FAMILIES
from kiln_triton import TritonCodegen
from kiln_triton import launcher as launcher_module
from kiln_triton.configs import Config


def _f(*shape, dtype=torch.float32):
    return lambda device: torch.randn(shape, dtype=dtype, device=device)


def _i(low, high, *shape):
    return lambda device: torch.randint(low, high, shape, device=device)


_POLYGAMMA_EDGES = torch.tensor([0.0, -1.0, -2.5, 0.5, 1e5, -12.3, float("inf"), float("nan")])

CASES = {
    "pointwise_chain": (
        lambda a, b: torch.sigmoid((a * 2 + b).relu()) - a.exp(),
        [_f(8, 16), _f(8, 16)],
    ),
    # values past 50, where i0e and i1e take the asymptotic series
    "bessel_erfcx_ndtri": (
        lambda a: (
            torch.special.i0e(a),
            torch.special.i1e(a),
            torch.i0(a / 8),
            torch.special.i1(a / 8),
            torch.special.erfcx(a / 4),
            torch.special.ndtri(torch.sigmoid(a / 10)),
        ),
        [lambda d: torch.randn(4, 8, device=d) * 40],
    ),
    # polygamma's poles, both sides of them (reflection, zeta's longer sum), inf and NaN
    "polygamma": (
        lambda a: (
            torch.polygamma(1, a),
            torch.polygamma(2, a),
            torch.special.polygamma(3, a),
            # (CUDA's float32 zeta past x = 30 or so overflows a tail product into NaN where
            # the value underflows to 0, as the CPU's gives)
            torch.special.zeta(a.abs().clamp(max=8) + 1.5, a.abs() * 2),
        ),
        [lambda d: torch.cat([torch.randn(3, 8) * 4, _POLYGAMMA_EDGES.reshape(1, 8)]).to(d)],
    ),
    "broadcast_4d": (lambda a, b: a * b + 1, [_f(2, 3, 4, 5), _f(3, 1, 5)]),
    "transpose_2d_tiles": (lambda a, b: a.t() * 2 + b, [_f(33, 20), _f(20, 33)]),
    "permute_3d": (lambda a: a.permute(2, 0, 1).contiguous() + 1, [_f(5, 6, 7)]),
    "int_floor_div_mod": (
        lambda a, b: (torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), a // 3),
        [
            _i(-50, 50, 6, 9),
            lambda d: (
                torch.randint(1, 9, (6, 9), device=d)
                * (1 - 2 * torch.randint(0, 2, (6, 9), device=d))
            ),
        ],
    ),
    "float_floor_div_mod": (
        lambda a, b: (
            torch.div(a, b, rounding_mode="floor"),
            torch.remainder(a, b),
            torch.fmod(a, b),
        ),
        [_f(6, 9), _f(6, 9)],
    ),
    "math": (
        lambda a: (
            a.tanh() + a.erf() + torch.log1p(a.abs()) + a.atan() + torch.expm1(a),
            torch.erfinv(a.clamp(-0.9, 0.9)),
            torch.lgamma(a.abs() + 0.5),
        ),
        [_f(4, 33)],
    ),
    "softmax": (lambda a: torch.softmax(a, -1), [_f(8, 33)]),
    "log_softmax_dim0": (lambda a: torch.log_softmax(a, 0), [_f(12, 5)]),
    "layernorm_gelu": (
        lambda a, w, b: F.gelu(F.layer_norm(a, (24,), w, b)),
        [_f(6, 24), _f(24), _f(24)],
    ),
    "var_mean": (lambda a: torch.var_mean(a, 1), [_f(6, 19)]),
    "row_and_column_sums": (
        lambda a: (a.sum(-1), a.sum(0), a.amax(0), a.mean((0, 2))),
        [_f(7, 13, 3)],
    ),
    "argmax_argmin": (lambda a: (a.argmax(1), a.argmin(0), a.argmax()), [_f(5, 37)]),
    "any_all_prod": (lambda a: ((a > 0).any(1), (a > -1).all(0), a.prod(1)), [_f(4, 9)]),
    "int_reductions": (lambda a: (a.sum(1), a.amax(0), a.argmin(1)), [_i(-100, 100, 5, 11)]),
    "bf16_compute_in_fp32": (
        lambda a, b: torch.softmax(a * b, -1) + F.silu(a),
        [_f(4, 40, dtype=torch.bfloat16), _f(4, 40, dtype=torch.bfloat16)],
    ),
    "fp16_layernorm": (
        lambda a, w: F.layer_norm(a, (32,), w),
        [_f(5, 32, dtype=torch.float16), _f(32, dtype=torch.float16)],
    ),
    "fp64": (lambda a: a.exp().sum(-1) / 3, [_f(4, 7, dtype=torch.float64)]),
    "masks_pad_cat": (
        lambda a, b: torch.cat([F.pad(a, (1, 2, 0, 1), value=3.0), b], 0),
        [_f(3, 4), _f(2, 7)],
    ),
    "indirect_gather_embedding": (
        lambda w, i, x: (F.embedding(i, w), torch.gather(x, 1, i[:, :3] % 4)),
        [_f(10, 6), _i(0, 10, 2, 5), _f(2, 4)],
    ),
    "negative_index": (lambda x, i: x[i] * 2, [_f(6, 3), _i(-6, 6, 4)]),
    "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), [_f(5, 3), _i(0, 5, 4, 3), _f(4, 3)]),
    "matmul_epilogue": (lambda x, w, b: F.gelu(x @ w + b), [_f(4, 6), _f(6, 3), _f(3)]),
    "searchsorted_histc": (
        lambda s, v: (
            torch.searchsorted(torch.sort(s).values, v, right=True),
            torch.histc(v, bins=4, min=-1, max=1),
        ),
        [_f(9), _f(2, 5)],
    ),
    "zero_dim_and_empty": (
        lambda x, y, e: (x * y + x.sum(), e + 1, e.sum(0)),
        [_f(), _f(3), _f(0, 4)],
    ),
}


def materialize(inputs, device):
    return [make(device) for make in inputs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name, device):
    fn, inputs = CASES[name]
    check_against_eager(fn, materialize(inputs, device), codegen=TritonCodegen())


def force(monkeypatch, variant: str, rblock: int, xblock: int = 2) -> None:
    """Launch every reduction kernel as ``variant`` with these blocks (several chunks)."""
    original = launcher_module.candidates

    def chosen(meta, numels):
        if meta["kind"] != "reduction":
            return original(meta, numels)
        blocks = (("XBLOCK", xblock), ("RBLOCK", rblock))
        return [Config(f"{meta['name']}_{variant}", blocks, 2)]

    monkeypatch.setattr(launcher_module, "candidates", chosen)


LOOPED = ["softmax", "layernorm_gelu", "var_mean", "row_and_column_sums", "argmax_argmin",
          "any_all_prod", "int_reductions", "bf16_compute_in_fp32"]  # fmt: skip


@pytest.mark.parametrize("name", LOOPED)
def test_looped_reductions_match_eager(name, device, monkeypatch):
    force(monkeypatch, "looped", rblock=4)
    fn, inputs = CASES[name]
    check_against_eager(fn, materialize(inputs, device), codegen=TritonCodegen())


def _cumulative(x):
    return (
        torch.cumsum(x.sin(), 1),
        torch.cumprod(x * 0.1 + 1, 0),
        torch.logcumsumexp(x, 0),
        *torch.cummax(x, 1),
        torch.cummin(x, 0).indices,
    )


@pytest.mark.parametrize("variant", ["looped", "persistent"])
def test_cumulative_ops_as_scans(variant, device, monkeypatch):
    force(monkeypatch, variant, rblock=4 if variant == "looped" else 16)
    x = torch.randn(5, 11, device=device)
    x[2, 5] = x[3, 1] = float("nan")  # a NaN stays in every scan after it
    x[1, :4] = 0.5  # ties: cummax/cummin take the latest
    check_against_eager(_cumulative, [x], codegen=TritonCodegen())


def test_persistent_with_several_rows_per_block(device, monkeypatch):
    force(monkeypatch, "persistent", rblock=64, xblock=4)
    fn, inputs = CASES["layernorm_gelu"]
    check_against_eager(fn, materialize(inputs, device), codegen=TritonCodegen())


@pytest.mark.parametrize("variant", ["looped", "persistent"])
def test_welford_is_stable_with_a_large_mean(variant, device, monkeypatch):
    # a sum of squares minus the squared mean would lose every digit here (1e8 - 1e8)
    force(monkeypatch, variant, rblock=8 if variant == "looped" else 512)
    x = torch.randn(3, 300, device=device) + 1e4
    compiled = compile_fn(lambda a: torch.var_mean(a, 1), [x], codegen=TritonCodegen())
    var, mean = compiled(x)
    want_var, want_mean = torch.var_mean(x.double(), 1)
    torch.testing.assert_close(mean.double(), want_mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(var.double(), want_var, rtol=1e-3, atol=0)


def test_dynamic_sizes_run_at_other_sizes(device):
    fn = lambda a: torch.softmax(a * 2, -1) + 1  # noqa: E731
    x = torch.randn(4, 10, device=device)
    check_against_eager(fn, [x], codegen=TritonCodegen(), dynamic=True,
                        run_inputs=[torch.randn(6, 13, device=device)])  # fmt: skip


@pytest.mark.parametrize("name", sorted(SIZE_FAMILIES))
def test_one_compile_runs_at_every_size_of_a_family(device, name):
    family = SIZE_FAMILIES[name]

    def inputs(n):
        return [t.to(device) for t in family.inputs(n)]

    compiled = check_sizes(family.fn, inputs, family.sizes, codegen=TritonCodegen())
    assert compiled.graph.size_hints, "compiled with symbolic sizes"


def test_non_contiguous_and_offset_inputs(device):
    x = torch.randn(6, 10, device=device)[:, ::2]
    y = torch.randn(5, 6, device=device).t()
    base = torch.randn(40, device=device)
    z = base[3:33].view(6, 5)
    check_against_eager(lambda a, b, c: torch.softmax(a + b, 1) * a + c, [x, y, z],
                        codegen=TritonCodegen())  # fmt: skip


def _stored_before_a_reduction(x, w, b, c):
    a = torch.mm(x, w)  # an intermediate the fused kernel is the last to read
    t = a * b
    u = t + c  # stored (a later product reads it) before the row sum
    return (t * c).sum(1, keepdim=True), u.to(torch.bfloat16), torch.mm(u, w)


def test_a_store_before_a_reduction_keeps_what_the_later_loop_reads(device, monkeypatch):
    # the looped variant computes u again after the sum, from a: u written over a's memory
    # in the first loop would be read there in a's place
    monkeypatch.setattr(matmul, "INLINE_MATMUL_MAX_MNK", 0)
    force(monkeypatch, "looped", rblock=4)
    x, w, b, c = (torch.randn(*s, device=device) for s in [(8, 16), (16, 16), (16,), (8, 16)])
    compiled = check_against_eager(
        _stored_before_a_reduction, [x, w, b, c], codegen=TritonCodegen()
    )
    assert "# in place" not in compiled.host_source
