"""The op-coverage corpus: special functions (erfinv, gamma functions, Bessel functions i0,
i1 and their scaled forms, the error function family, erfcx, ndtri), clamps in every form,
and the rarer binary ops. See test_op_coverage.py."""

from __future__ import annotations

import pytest
import torch
from op_corpus import Frame, check_frame

special = torch.special


def _positive(x):
    return x.abs() + 0.5


FRAMES = {
    "erfinv": Frame(lambda x: torch.erfinv(x.sin() * 0.9) * x, ((4, 6),), fused=True),
    "lgamma": Frame(lambda x: torch.lgamma(x * 3) + x, ((4, 6),), fused=True),
    # digamma's derivative is polygamma(1, x), which runs through ATen
    "digamma": Frame(
        lambda x: torch.digamma(_positive(x)) * 2,
        ((4, 6),),
        fused=True,
        externs=("aten.polygamma",),
    ),
    "polygamma_1": Frame(lambda x: torch.polygamma(1, _positive(x)) + x, ((4, 6),)),
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
