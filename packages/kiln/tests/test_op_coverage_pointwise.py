"""The op-coverage corpus: special functions (erfinv, gamma functions and polygamma, the
Hurwitz zeta function, Bessel functions i0, i1 and their scaled forms, the error function
family, erfcx, ndtri), clamps in every form, and the rarer binary ops. See
test_op_coverage.py."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from op_corpus import Frame, _assert_no_extern_call, check_frame

import kiln

special = torch.special


def _positive(x):
    return x.abs() + 0.5


FRAMES = {
    "erfinv": Frame(lambda x: torch.erfinv(x.sin() * 0.9) * x, ((4, 6),), fused=True),
    "lgamma": Frame(lambda x: torch.lgamma(x * 3) + x, ((4, 6),), fused=True),
    # digamma's derivative is polygamma(1, x): trigamma, in the kernels
    "digamma": Frame(lambda x: torch.digamma(_positive(x)) * 2, ((4, 6),), fused=True),
    # negative x: digamma's and trigamma's reflections
    "digamma_negative": Frame(lambda x: torch.digamma(x * 3), ((4, 6),), fused=True),
    "polygamma_1": Frame(lambda x: torch.polygamma(1, _positive(x)) + x, ((4, 6),), fused=True),
    # orders past 1 (the Hurwitz zeta function), their derivatives one order up
    "polygamma_orders": Frame(
        lambda x: torch.polygamma(2, x * 3) + special.polygamma(3, x * 3) * torch.polygamma(0, x),
        ((4, 6),),
        fused=True,
    ),
    "polygamma_float64": Frame(
        lambda x: [torch.polygamma(n, x * 4) for n in (1, 2, 5)],
        ((4, 6),),
        fused=True,
        dtype=torch.float64,
    ),
    # zeta's derivative in its first argument is not implemented, eagerly either
    "zeta_scalar_order": Frame(lambda x: special.zeta(3.0, x * 3) + x, ((4, 6),), fused=True),
    # (NaN for negative q unless s is an integer)
    "zeta": Frame(
        lambda s, q: special.zeta(s.abs() * 2 + 1, _positive(q) * 3), ((4, 6), (4, 6)), False, True
    ),
    "mvlgamma": Frame(lambda x: torch.mvlgamma(_positive(x) + 1, 2), ((4, 6),), fused=True),
    "i0": Frame(lambda x: torch.i0(x * 2) - 1, ((4, 6),), fused=True),
    "i0e_i1": Frame(lambda x: special.i0e(x) + special.i1(x.sin()), ((4, 6),), fused=True),
    # past 8 (the second expansion), large and negative
    "i0e_i1e_large": Frame(
        lambda x: special.i0e(x * 30) * special.i1e(x * 30) + special.i1e(x), ((4, 6),), fused=True
    ),
    "i0_i1_float64": Frame(
        lambda x: torch.i0(x * 6) + special.i1(x * 6), ((4, 6),), fused=True, dtype=torch.float64
    ),
    "erfcx": Frame(lambda x: special.erfcx(x * 2) + x, ((4, 6),), fused=True),
    "erfcx_wide_float64": Frame(
        lambda x: special.erfcx(x * 10), ((4, 6),), fused=True, dtype=torch.float64
    ),
    "ndtr_ndtri": Frame(
        lambda x: special.ndtr(x) + special.ndtri(x.sigmoid() * 0.9 + 0.05), ((4, 6),), fused=True
    ),
    "ndtri_tails": Frame(lambda x: special.ndtri(torch.sigmoid(x * 4)), ((4, 6),), fused=True),
    "log_ndtr": Frame(lambda x: special.log_ndtr(x * 3), ((4, 6),), fused=True),
    "sinc": Frame(lambda x: torch.sinc(x * 2) * x, ((4, 6),), fused=True),
    "xlogy": Frame(lambda x, y: special.xlogy(x, _positive(y)), ((4, 6), (4, 6)), fused=True),
    "logit_eps": Frame(lambda x: torch.logit(x.sigmoid(), eps=1e-3), ((4, 6),), fused=True),
    "entr_expit": Frame(lambda x: special.entr(special.expit(x)), ((4, 6),), fused=True),
    "logaddexp": Frame(
        lambda x, y: torch.logaddexp(x * 3, y) + torch.logaddexp2(x, y),
        ((4, 6), (4, 6)),
        fused=True,
    ),
    "frac": Frame(lambda x: torch.frac(x * 3) * x, ((4, 6),), fused=True),
    # heaviside has no derivative, eagerly either
    "heaviside": Frame(lambda x: torch.heaviside(x, torch.tensor(0.5)) + x, ((4, 6),), False, True),
    "float_power": Frame(lambda x: torch.float_power(_positive(x), 1.5), ((4, 6),), fused=True),
    "ldexp": Frame(lambda x: torch.ldexp(x, torch.tensor([1, 2, -1, 0])), ((3, 4),), fused=True),
    "atan2_hypot": Frame(
        lambda x, y: torch.atan2(x, y) * torch.hypot(x, y), ((4, 6), (4, 6)), fused=True
    ),
    "clamp": Frame(lambda x: torch.clamp(x * 2, -1, 0.5) + x, ((4, 6),), fused=True),
    "clamp_min_only": Frame(lambda x: x.sin().clamp(min=0.1).log(), ((4, 6),), fused=True),
    "clamp_max_only": Frame(lambda x: torch.clamp_max(x, 0.3) * x, ((4, 6),), fused=True),
    "clamp_tensor_bounds": Frame(
        lambda x, lo: torch.clamp(x, lo, lo + 1), ((4, 6), (6,)), fused=True
    ),
    "clip": Frame(lambda x: torch.clip(x.exp(), max=2.0) - 1, ((4, 6),), fused=True),
    "hardtanh_relu6": Frame(
        lambda x: torch.nn.functional.hardtanh(x, -0.5, 0.5) + torch.nn.functional.relu6(x * 4),
        ((4, 6),),
        fused=True,
    ),
    "nextafter_copysign": Frame(
        lambda x, y: torch.copysign(torch.nextafter(x, y), y), ((4, 6), (4, 6)), False, True
    ),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)


# polygamma's poles (0, negative integers), both sides of them, large values, inf and NaN
POLYGAMMA_EDGES = [0.0, -0.0, -1.0, -2.0, -2.5, -0.5, 0.5, 1e-3, 1e30, 1e5, -10.3, -100.7]
POLYGAMMA_EDGES += [float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_polygamma_edges_and_digamma_gradient(dtype, tmp_path, caplog):
    """polygamma of orders 0 to 6 and digamma's gradient (trigamma) equal eager's at the
    edge values and on fresh random ones, compiled to C++ kernels with no extern call."""
    x = torch.cat([torch.tensor(POLYGAMMA_EDGES), torch.randn(17) * 5]).to(dtype)
    caplog.set_level(logging.INFO, logger="kiln.fallbacks")

    def orders(v):
        return [torch.polygamma(n, v) for n in range(7)]

    options = {"cache": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an eager fallback fails the test
        inference = kiln.compile(orders, options={**options, "debug_dir": str(tmp_path / "i")})
        for got, want in zip(inference(x), orders(x), strict=True):
            torch.testing.assert_close(got, want, equal_nan=True)
        training = kiln.compile(
            torch.digamma, options={**options, "debug_dir": str(tmp_path / "t")}
        )
        leaf, eager_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, want = training(leaf), torch.digamma(eager_leaf)
        torch.testing.assert_close(out, want, equal_nan=True)
        grad = torch.autograd.grad(out, leaf, torch.ones_like(out))[0]
        want_grad = torch.autograd.grad(want, eager_leaf, torch.ones_like(want))[0]
    torch.testing.assert_close(grad, want_grad, equal_nan=True)
    _assert_no_extern_call(Frame(orders, ()), tmp_path, caplog)
