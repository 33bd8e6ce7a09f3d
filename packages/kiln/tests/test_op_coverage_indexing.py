"""The op-coverage corpus: gather and scatter, index ops, advanced indexing, masks and
where, and the copies of slices (select/slice/diagonal scatter). Index tensors are fixed
(a seeded generator) or computed in the frame from its input. See test_op_coverage.py."""

from __future__ import annotations

import pytest
import torch
from op_corpus import LOOSE, Frame, check_frame

_GEN = torch.Generator().manual_seed(14)
ROWS = torch.randint(0, 5, (3, 6), generator=_GEN)  # rows of a (5, 6) tensor, repeats
COLS = torch.randint(0, 6, (4, 3), generator=_GEN)  # columns of a (4, 6) tensor
PERM = torch.randperm(6, generator=_GEN)  # distinct: a scatter of them has one writer each
PICK = torch.tensor([4, 0, 2, 2])  # rows of a (5, ...) tensor, one repeated
MASK = torch.rand(4, 6, generator=_GEN) > 0.5


def _distinct_cols(x):
    return PERM[:3].expand(x.shape[0], 3)


FRAMES = {
    "gather_dim0": Frame(lambda x: torch.gather(x.sin(), 0, ROWS) * 2, ((5, 6),), fused=True),
    "gather_dim1": Frame(lambda x: torch.gather(x, 1, COLS).exp(), ((4, 6),), fused=True),
    "gather_computed_index": Frame(
        lambda x: torch.gather(x, 1, (x.abs() * 3).long() % 5) + x, ((4, 5),), fused=True
    ),
    "take_along_dim": Frame(
        lambda x: torch.take_along_dim(x.cos(), x.argsort(1)[:, :2], 1), ((4, 6),)
    ),
    "take": Frame(lambda x: torch.take(x * 2, PERM), ((3, 4),), fused=True),
    "scatter_src": Frame(
        lambda x, y: torch.scatter(x, 1, _distinct_cols(y), y.sin()), ((4, 6), (4, 3)), fused=True
    ),
    "scatter_value": Frame(
        lambda x: torch.scatter(x.exp(), 1, _distinct_cols(x), 0.5), ((4, 6),), fused=True
    ),
    "scatter_add": Frame(
        lambda x, y: torch.scatter_add(x, 0, ROWS, y.tanh()), ((5, 6), (3, 6)), fused=True
    ),
    "scatter_reduce_sum": Frame(
        lambda x, y: x.scatter_reduce(0, ROWS, y * 2, "sum"), ((5, 6), (3, 6)), fused=True
    ),
    "scatter_reduce_prod": Frame(
        lambda x, y: x.scatter_reduce(0, ROWS, y.sin() + 1.5, "prod"),
        ((5, 6), (3, 6)),
        fused=True,
        **LOOSE,
    ),
    "scatter_reduce_amax_exclude_self": Frame(
        lambda x, y: x.scatter_reduce(0, ROWS, y, "amax", include_self=False),
        ((5, 6), (3, 6)),
        fused=True,
    ),
    "scatter_reduce_amin": Frame(
        lambda x, y: x.cos().scatter_reduce(0, ROWS, y, "amin"), ((5, 6), (3, 6)), fused=True
    ),
    "scatter_reduce_prod_dim1_float64": Frame(
        lambda x, y: x.scatter_reduce(1, COLS, y.exp(), "prod", include_self=False),
        ((4, 6), (4, 3)),
        fused=True,
        dtype=torch.float64,
    ),
    "scatter_reduce_mean": Frame(
        lambda x, y: x.scatter_reduce(0, ROWS, y.exp(), "mean"), ((5, 6), (3, 6)), fused=True
    ),
    "index_add": Frame(
        lambda x, y: x.index_add(0, PICK, y.sin(), alpha=2), ((5, 3), (4, 3)), fused=True
    ),
    "index_copy": Frame(
        lambda x, y: x.index_copy(1, PERM[:2], y * 3), ((4, 6), (4, 2)), fused=True
    ),
    "index_fill": Frame(lambda x: x.exp().index_fill(1, PERM[:3], -1.0), ((4, 6),), fused=True),
    "index_put": Frame(
        lambda x, y: torch.index_put(x, (PERM[:4] % 5,), y), ((5, 3), (4, 3)), fused=True
    ),
    "index_put_accumulate": Frame(
        lambda x, y: torch.index_put(x.sin(), (PICK,), y, accumulate=True),
        ((5, 3), (4, 3)),
        fused=True,
    ),
    "index_put_2d_indices": Frame(
        lambda x, y: x.index_put((PICK, PERM[:4]), y.exp()), ((5, 6), (4,)), fused=True
    ),
    "index_select": Frame(lambda x: torch.index_select(x, 0, PICK).cos(), ((5, 3),), fused=True),
    "index_reduce_amax": Frame(lambda x, y: x.index_reduce(0, PICK, y, "amax"), ((5, 3), (4, 3))),
    "advanced_index_rows": Frame(lambda x: x.sin()[PICK] * 2, ((5, 3),), fused=True),
    "advanced_index_cols_pairs": Frame(
        lambda x: x[PICK, PERM[:4]] + x[:, PERM].sum(1)[PICK], ((5, 6),), fused=True
    ),
    "setitem_mask_value": Frame(lambda x: _setitem_mask(x.clone()), ((4, 6),), fused=True),
    "masked_fill": Frame(lambda x: x.masked_fill(x > 0.5, -2.0) * x, ((4, 6),), fused=True),
    "masked_fill_tensor_value": Frame(
        lambda x, v: x.sin().masked_fill(MASK, v.sum()), ((4, 6), (3,)), fused=True
    ),
    "where": Frame(lambda x, y: torch.where(x > y, x * 2, y.exp()), ((4, 6), (4, 6)), fused=True),
    "where_scalar_broadcast": Frame(
        lambda x: torch.where(MASK, x, 0.0) + torch.where(x < 0, 1.0, x), ((4, 6),), fused=True
    ),
    "masked_scatter": Frame(lambda x, y: x.masked_scatter(MASK, y.cos()), ((4, 6), (4, 6))),
    "select_scatter": Frame(
        lambda x, y: torch.select_scatter(x, y.exp(), 1, 2), ((4, 6), (4,)), fused=True
    ),
    "slice_scatter": Frame(
        lambda x, y: torch.slice_scatter(x.sin(), y, 1, 1, 6, 2), ((4, 6), (4, 3)), fused=True
    ),
    "diagonal_scatter": Frame(
        lambda x, y: torch.diagonal_scatter(x, y * 2, 1), ((4, 6), (4,)), fused=True
    ),
    "roll": Frame(lambda x: torch.roll(x.sin(), (1, -2), (0, 1)) * x, ((4, 6),), fused=True),
    "tril_triu": Frame(lambda x: x.tril(-1) + x.exp().triu(2), ((5, 6),), fused=True),
    "repeat_interleave": Frame(
        lambda x: torch.repeat_interleave(x.cos(), 2, dim=0), ((3, 4),), fused=True
    ),
    "rot90": Frame(lambda x: torch.rot90(x * 2, 1, (0, 1)) + 1, ((3, 5),), fused=True),
}


def _setitem_mask(x):
    x[MASK] = 3.0
    return x * 2


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)
