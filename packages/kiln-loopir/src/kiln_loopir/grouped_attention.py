"""Grouped-query attention as one op: keys and values with fewer heads than the queries.

A model with grouped-query attention (Llama, Mistral, ...) repeats each key and value head
for the ``group`` query heads that share it before calling
``scaled_dot_product_attention``: ``k[:, :, None].expand(b, kv_heads, group, n, d)
.reshape(b, kv_heads * group, n, d)``, a copy of every key and value. ATen's fused
attention ops take only equal head counts, so a graph keeps that copy.
``kiln_loopir::grouped_attention`` takes the keys and values before the repeat: query
head ``h`` reads key and value head ``h // group``. Kiln's attention kernel computes it
with no copy (``kiln_triton.attention``); elsewhere the op runs ATen's
``scaled_dot_product_attention`` with ``enable_gqa=True``.

The output is laid out with the strides the op is given (``out_stride``): those of the
ATen op it replaces (each fused op lays its output out its own way), so a graph's views
of it keep theirs. Forward only: a graph that differentiates through attention keeps
ATen's op and its backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.library.custom_op("kiln_loopir::grouped_attention", mutates_args=())
def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    out_stride: list[int],
) -> torch.Tensor:
    """Attention of ``query`` ([batch, heads, queries, dim]) over ``key`` and ``value``
    ([batch, heads // group, keys, dim]); ``attn_mask`` is added to the scores (or None)."""
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=True,
    )  # fmt: skip
    return torch.empty_strided(
        query.shape, out_stride, dtype=query.dtype, device=query.device
    ).copy_(out)


@grouped_attention.register_fake
def _(query, key, value, attn_mask, is_causal, scale, out_stride):
    torch._check(
        query.dim() == 4 and key.dim() == 4 and query.size(1) % key.size(1) == 0,
        lambda: "grouped_attention: the queries' heads must be a multiple of the keys'",
    )
    return query.new_empty_strided(query.shape, out_stride)


GROUPED_ATTENTION = torch.ops.kiln_loopir.grouped_attention.default
