"""Frames built around ops outside the usual fused set compile whole, and match eager.

The corpus is split by family, one file each: reductions here (to a scalar, along dims,
statistics, the nan* ops), then ``_scans`` (cumulative ops, bucketing), ``_sorting``,
``_indexing`` (gather, scatter, index ops, masks), ``_linalg``, ``_fft``, ``_pointwise``
(special functions, clamps), ``_nn`` (padding, interpolation, convolution, pooling,
embeddings) and ``_regions`` (autocast, data-dependent shapes, NumPy on tensors). Every frame
goes through one check, :func:`op_corpus.check_frame`: compiled with no eager fallback,
kernels generated, equal to eager forward and backward.
"""

from __future__ import annotations

import pytest
import torch
from op_corpus import LOOSE, Frame, check_frame

# torch has a derivative for aminmax from 2.13 on (the one of amin and amax); eager before
# cannot differentiate it, while Kiln traces it as amin and amax on every version
AMINMAX_HAS_GRAD = (
    type(torch.aminmax(torch.ones(2, requires_grad=True)).min.grad_fn).__name__ != "NotImplemented"
)

FRAMES = {
    "max": Frame(lambda x: (x.sin().max() * 2 + x).cos(), ((4, 6),), fused=True),
    "min": Frame(lambda x: (x.cos().min() - x).exp(), ((4, 6),), fused=True),
    "argmax": Frame(lambda x: (x * 3).argmax() + x.sum().long(), ((4, 6),), False, True),
    "argmin_dim": Frame(lambda x: x.cos().argmin(1) * 2, ((5, 7),), False, True),
    "max_dim": Frame(
        lambda x: [t * 2 for t in torch.max(x.sin(), dim=1, keepdim=True)], ((4, 6),), fused=True
    ),
    "min_dim": Frame(lambda x: torch.min(x.exp(), 0).values - x, ((4, 6),), fused=True),
    "amax_dims": Frame(lambda x: torch.amax(x.sin(), dim=(0, 2)) + 1, ((3, 4, 5),), fused=True),
    "amin_keepdim": Frame(lambda x: x - torch.amin(x, 1, keepdim=True), ((4, 6),), fused=True),
    "aminmax": Frame(
        lambda x: torch.aminmax(x.tanh(), dim=1),
        ((4, 6),),
        fused=True,
        eager=None if AMINMAX_HAS_GRAD else lambda x: (x.tanh().amin(1), x.tanh().amax(1)),
    ),
    "aminmax_all": Frame(
        lambda x: [t * x for t in torch.aminmax(x.cos())],
        ((4, 6),),
        fused=True,
        eager=None if AMINMAX_HAS_GRAD else lambda x: [x.cos().amin() * x, x.cos().amax() * x],
    ),
    "logsumexp": Frame(lambda x: torch.logsumexp(x * 3, dim=1) + 1, ((4, 6),), fused=True),
    "logsumexp_all_dims": Frame(lambda x: torch.logsumexp(x, (0, 1)) * x, ((4, 6),), fused=True),
    "var_mean": Frame(
        lambda x: [t * 2 for t in torch.var_mean(x.sin() + 1, dim=1, correction=0)],
        ((4, 6),),
        fused=True,
    ),
    "var_mean_unbiased": Frame(
        lambda x: torch.var_mean(x.tanh(), dim=0, keepdim=True)[0] + x, ((5, 3),), fused=True
    ),
    "var_all": Frame(lambda x: x / x.var(), ((4, 6),), fused=True),
    "std_dim": Frame(lambda x: x.sin().std(1, keepdim=True) * x, ((4, 6),), fused=True),
    "std_mean_correction_2": Frame(
        lambda x: torch.std_mean(x, dim=0, correction=2), ((6, 3),), fused=True
    ),
    "prod_all": Frame(lambda x: (x.sin() + 1.5).prod() * x, ((3, 4),), fused=True, **LOOSE),
    "prod_dim": Frame(lambda x: (x.cos() + 1).prod(1) + 1, ((4, 6),), fused=True),
    "all_any": Frame(
        lambda x: x * (x > -2).all(1, keepdim=True) + (x > 1).any(), ((4, 6),), fused=True
    ),
    "count_nonzero": Frame(
        lambda x: torch.count_nonzero(x.relu(), dim=1) * 2, ((4, 6),), False, True
    ),
    "sum_float64": Frame(lambda x: x.sin().sum() + x, ((5, 7),), fused=True, dtype=torch.float64),
    "mean_bfloat16": Frame(lambda x: x.mean(1) * 2, ((4, 9),), fused=True, dtype=torch.bfloat16),
    "norm": Frame(lambda x: x / (x.relu().norm() + 1), ((4, 6),), fused=True),
    "norm_p1_dim": Frame(lambda x: torch.norm(x, p=1, dim=1) * 2, ((4, 6),), fused=True),
    "vector_norm_3": Frame(
        lambda x: torch.linalg.vector_norm(x.sin(), 3) * x.cos(), ((4, 6),), fused=True
    ),
    "vector_norm_inf": Frame(
        lambda x: torch.linalg.vector_norm(x, float("inf"), dim=0) + 1, ((4, 6),), fused=True
    ),
    "log_softmax": Frame(lambda x: torch.log_softmax(x * 2, 0) - x, ((5, 4),), fused=True),
    "nansum": Frame(
        lambda x: torch.nansum(torch.where(x > 1, float("nan"), x), 1), ((4, 6),), fused=True
    ),
    "nanmean": Frame(
        lambda x: torch.nanmean(torch.where(x > 1, float("nan"), x.sin())), ((4, 6),), fused=True
    ),
    "nan_to_num": Frame(
        lambda x: torch.nan_to_num((x * 2).log(), nan=0.5, neginf=-3.0) + x, ((4, 6),), fused=True
    ),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)
