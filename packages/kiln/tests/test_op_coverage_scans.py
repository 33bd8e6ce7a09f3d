"""The op-coverage corpus: cumulative ops (scans in kiln-cpp) along every kind of dim, and
bucketing (searchsorted, bucketize, histc). See test_op_coverage.py."""

from __future__ import annotations

import pytest
import torch
from op_corpus import LOOSE, Frame, check_frame

FRAMES = {
    "cumsum": Frame(lambda x: torch.cumsum(x.sin(), 0) * x, ((4, 7),), fused=True),
    "cumsum_3d_middle_dim": Frame(
        lambda x: torch.cumsum(x * 2, 1).exp() / 4, ((3, 4, 6),), fused=True
    ),
    "cumsum_float64": Frame(
        lambda x: torch.cumsum(x.cos(), -1) + x, ((9, 4),), fused=True, dtype=torch.float64
    ),
    "cumsum_bfloat16": Frame(
        lambda x: torch.cumsum(x, 1) * 2, ((10, 3),), False, True, dtype=torch.bfloat16
    ),
    "cumsum_long": Frame(lambda x: torch.cumsum(x.sin(), 1) * x, ((3, 40),), fused=True),
    "cumsum_int64": Frame(lambda x: torch.cumsum((x * 4).long(), 0) + 1, ((9, 3),), False, True),
    "cumsum_dtype_arg": Frame(
        lambda x: torch.cumsum(x, 0, dtype=torch.float64) * 3, ((5, 4),), fused=True
    ),
    "cumsum_reversed": Frame(
        lambda x: torch.cumsum(x.flip(1), 1).flip(1) - x, ((4, 6),), fused=True
    ),
    "cumprod": Frame(lambda x: torch.cumprod(x.sin() + 1.5, 1) * x, ((6, 4),), fused=True, **LOOSE),
    "cumprod_3d_dim0": Frame(
        lambda x: torch.cumprod(x.cos() + 1, 0) + 1, ((4, 3, 2),), fused=True, **LOOSE
    ),
    "logcumsumexp": Frame(lambda x: torch.logcumsumexp(x * 2, 1).tanh(), ((6, 4),), fused=True),
    "logcumsumexp_dim0": Frame(lambda x: torch.logcumsumexp(x, 0) - x, ((3, 11),), fused=True),
    "logcumsumexp_float64": Frame(
        lambda x: torch.logcumsumexp(x.sin(), -1), ((4, 5),), fused=True, dtype=torch.float64
    ),
    "cummax": Frame(
        lambda x: torch.cummax(x.sin(), 0).values * x + torch.cummax(x, 1).indices,
        ((4, 3),),
        fused=True,
    ),
    "cummax_long": Frame(lambda x: torch.cummax(x * 2, 0).values.exp(), ((19, 2),), fused=True),
    "cummin_3d": Frame(
        lambda x: torch.cummin(x.exp(), -1).values - torch.cummin(x, 1).indices,
        ((2, 3, 4),),
        fused=True,
    ),
    "diff": Frame(lambda x: torch.diff(x.sin(), dim=1) * 2, ((4, 6),), fused=True),
    "cumulative_trapezoid": Frame(
        lambda x: torch.cumulative_trapezoid(x.exp(), dim=0), ((5, 3),), fused=True
    ),
    "searchsorted": Frame(
        lambda x, y: torch.searchsorted(torch.sort(x.flatten()).values, y.cos()) * 2 + 1,
        ((4, 6), (3, 5)),
        differentiable=False,
        fused=True,
        externs=("aten.sort",),
    ),
    "searchsorted_rows_right": Frame(
        lambda x, y: torch.searchsorted(torch.sort(x, 1).values, y, right=True, out_int32=True),
        ((3, 13), (3, 5)),
        differentiable=False,
        fused=True,
        externs=("aten.sort",),
    ),
    "bucketize": Frame(
        lambda x: torch.bucketize(x.sin(), torch.tensor([-0.5, 0.0, 0.5])) + x.abs(),
        ((4, 6),),
        fused=True,
    ),
    "histc": Frame(
        lambda x: torch.histc(x.sin(), bins=5, min=-1, max=1) / x.numel() + 1,
        ((4, 6),),
        differentiable=False,
        fused=True,
    ),
    "histc_float64_bins_7": Frame(
        lambda x: torch.histc(x, bins=7, min=-2, max=1.5) * 2,
        ((5, 31),),
        differentiable=False,
        fused=True,
        dtype=torch.float64,
    ),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)
