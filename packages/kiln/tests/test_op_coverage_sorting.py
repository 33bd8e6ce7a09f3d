"""The op-coverage corpus: sorting and order statistics (sort, argsort, topk, kthvalue,
median, mode, quantile). See test_op_coverage.py."""

from __future__ import annotations

import pytest
import torch
from op_corpus import Frame, check_frame

FRAMES = {
    "sort": Frame(lambda x: torch.sort(x.sin(), 1).values * x, ((4, 6),)),
    "sort_descending_dim0": Frame(
        lambda x: [t * 2 for t in torch.sort(x * 3, 0, descending=True)], ((5, 3),)
    ),
    "sort_stable_ties": Frame(
        lambda x: torch.sort((x * 2).round(), dim=1, stable=True).indices + 1, ((4, 9),), False
    ),
    "argsort": Frame(lambda x: torch.argsort(x.cos(), dim=-1) * 2, ((3, 7),), False),
    "msort": Frame(lambda x: torch.msort(x.exp()) - 1, ((6, 3),)),
    "topk": Frame(lambda x: torch.topk(x.sin(), 3).values.exp(), ((4, 8),)),
    "topk_smallest_dim0": Frame(
        lambda x: [t + 1 for t in torch.topk(x * 2, 2, dim=0, largest=False)], ((6, 5),)
    ),
    "topk_3d_unsorted_sum": Frame(
        lambda x: torch.topk(x, 2, dim=1, sorted=False).values.sum(1) * 2, ((2, 5, 3),)
    ),
    "kthvalue": Frame(lambda x: torch.kthvalue(x.exp(), 2, dim=1).values.sigmoid(), ((4, 6),)),
    "kthvalue_keepdim_indices": Frame(
        lambda x: [t * 2 for t in torch.kthvalue(x.sin(), 3, 0, keepdim=True)], ((5, 4),)
    ),
    "median": Frame(lambda x: torch.median(x.sin()) + x * 2, ((4, 6),)),
    "median_dim": Frame(lambda x: torch.median(x * 2, dim=1).values.cos(), ((4, 7),)),
    "nanmedian": Frame(
        lambda x: torch.nanmedian(torch.where(x > 1, float("nan"), x), 0).values, ((5, 4),)
    ),
    "mode": Frame(lambda x: torch.mode((x * 2).round(), 1).values + 1, ((4, 9),), False),
    "quantile": Frame(lambda x: torch.quantile(x.sin(), 0.3, dim=1) * 2, ((4, 6),)),
    "quantile_many_nearest": Frame(
        lambda x: torch.quantile(x, torch.tensor([0.1, 0.5, 0.9]), interpolation="nearest"),
        ((4, 6),),
    ),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)
