"""Index ops that torch leaves whole, as ops kiln-loopir lowers: ``put`` (an ``index_put``
of the flattened tensor), ``diagonal_scatter`` (a ``where`` over the diagonal's positions)
and ``scatter_reduce``: with ``sum`` or ``mean`` ``scatter_add``s of the values and of
their counts; with ``prod``, ``amax`` or ``amin`` a reduction over a table of every
(target row, index) pair, each value where its index names the row and the reduction's
identity elsewhere (up to :data:`MAX_REDUCE_TABLE` entries).
"""

from __future__ import annotations

import torch

from kiln_autograd.decompositions import register_decomposition

aten = torch.ops.aten

# the most (target row, index) pairs a scatter_reduce with prod, amax or amin reduces over;
# past it (or with sizes that are symbols) the op keeps ATen's kernel
MAX_REDUCE_TABLE = 1 << 16


@register_decomposition(aten.put.default)
def put(x, index, source, accumulate=False):
    flat = aten.index_put.default(
        x.reshape(-1), (index.reshape(-1),), source.reshape(-1), accumulate
    )
    return flat.view(x.shape)


@register_decomposition(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    rows = torch.arange(x.shape[dim1], device=x.device).unsqueeze(1)
    cols = torch.arange(x.shape[dim2], device=x.device).unsqueeze(0)
    on_diagonal = cols - rows == offset  # (rows, cols)
    # element k of the diagonal sits at row k (offset >= 0) or column k (offset < 0)
    along = (rows if offset >= 0 else cols).expand(on_diagonal.shape)
    picked = src[..., along.clamp(max=max(src.shape[-1] - 1, 0))]  # (..., rows, cols)
    if dim1 < dim2:
        picked = picked.movedim((-2, -1), (dim1, dim2))
    else:
        picked = picked.movedim((-1, -2), (dim2, dim1))
    mask_shape = [1] * x.dim()
    mask_shape[dim1], mask_shape[dim2] = on_diagonal.shape
    mask = on_diagonal.reshape(mask_shape) if dim1 < dim2 else on_diagonal.T.reshape(mask_shape)
    return torch.where(mask, picked, x)


@register_decomposition(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if reduce in ("prod", "amax", "amin"):
        return _scatter_reduce_table(x, dim, index, src, reduce, include_self)
    if reduce not in ("sum", "mean") or not x.dtype.is_floating_point:
        return NotImplemented  # integer means keep ATen's kernel
    base = x if include_self else x.scatter(dim, index, 0)
    total = base.scatter_add(dim, index, src)
    if reduce == "sum":
        return total
    counts = torch.zeros_like(x).scatter_add(dim, index, torch.ones_like(src))
    if include_self:
        return total / (counts + 1)
    return torch.where(counts > 0, total / counts.clamp(min=1), x)


def _identity(reduce: str, dtype: torch.dtype) -> float | int:
    if reduce == "prod":
        return 1
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    low, high = (-float("inf"), float("inf")) if dtype.is_floating_point else (info.min, info.max)
    return low if reduce == "amax" else high


def _scatter_reduce_table(x, dim, index, src, reduce, include_self):
    """``prod``, ``amax`` or ``amin`` of the values each row of ``x`` receives: the values
    are laid out against every row of ``dim`` (a new dimension before ``dim``), kept where
    their index names that row, and reduced along the index's ``dim``."""
    sizes = [*x.shape, *index.shape]
    if x.dim() == 0 or x.dtype == torch.bool or not all(isinstance(n, int) for n in sizes):
        return NotImplemented
    dim = dim % x.dim()
    rows = x.shape[dim]
    if rows * index.numel() > MAX_REDUCE_TABLE or index.numel() == 0:
        return NotImplemented
    values = src[tuple(slice(0, n) for n in index.shape)].to(x.dtype)
    row_shape = [rows if d == dim else 1 for d in range(x.dim() + 1)]
    row_of = torch.arange(rows, device=x.device).view(row_shape)
    hit = index.unsqueeze(dim) == row_of  # (..., row, index along dim, ...)
    table = torch.where(hit, values.unsqueeze(dim), _identity(reduce, x.dtype))
    reduced = {"prod": torch.prod, "amax": torch.amax, "amin": torch.amin}[reduce](table, dim + 1)
    # the rows that receive a value, counted by a scatter-add (which checks the indices'
    # bounds, as ATen's kernel does)
    counts = torch.zeros_like(x, dtype=torch.int32).scatter_add(
        dim, index, torch.ones_like(index, dtype=torch.int32)
    )
    pad = []
    for d in reversed(range(x.dim())):
        pad += [0, x.shape[d] - reduced.shape[d]]
    reduced = aten.constant_pad_nd(reduced, pad, _identity(reduce, x.dtype))
    if include_self:
        combine = {"prod": torch.mul, "amax": torch.maximum, "amin": torch.minimum}[reduce]
        reduced = combine(x, reduced)
    return torch.where(counts > 0, reduced, x)
