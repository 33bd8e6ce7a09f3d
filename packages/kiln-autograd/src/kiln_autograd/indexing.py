"""Index ops that torch leaves whole, as ops kiln-loopir lowers: ``put`` (an ``index_put``
of the flattened tensor), ``diagonal_scatter`` (a ``where`` over the diagonal's positions)
and ``scatter_reduce`` with ``sum`` or ``mean`` (``scatter_add``s of the values and of
their counts).
"""

from __future__ import annotations

import torch

from kiln_autograd.decompositions import register_decomposition

aten = torch.ops.aten


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
    if reduce not in ("sum", "mean") or not x.dtype.is_floating_point:
        return NotImplemented  # prod, amax, amin and integer means keep ATen's kernel
    base = x if include_self else x.scatter(dim, index, 0)
    total = base.scatter_add(dim, index, src)
    if reduce == "sum":
        return total
    counts = torch.zeros_like(x).scatter_add(dim, index, torch.ones_like(src))
    if include_self:
        return total / (counts + 1)
    return torch.where(counts > 0, total / counts.clamp(min=1), x)
