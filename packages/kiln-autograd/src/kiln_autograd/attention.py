"""Fused attention on CUDA: the kernel ``scaled_dot_product_attention`` becomes in a graph.

Traced on fake tensors, ATen's backend choice (``_fused_sdp_choice``) does not always see
what a CUDA device takes and may pick the math form: two matmuls and a softmax, in
float32 for half-precision inputs. While a graph is traced, :class:`FusedAttention` routes
``scaled_dot_product_attention`` through :func:`scaled_dot_product_attention`, which asks
the real choice on empty CUDA tensors with the inputs' sizes, strides and dtypes and calls
the fused op eager calls (flash, memory-efficient or cuDNN attention), so a graph holds
one attention kernel as eager runs it. Everything else keeps ATen's own path: other
devices, dynamic sizes, dropout, grouped-query inputs, and masks the fused ops would need
padded.

The routing runs above the dispatcher, where autocast has not yet cast anything, and the
fused ops have no autocast rule of their own: under autocast the inputs are cast first, as
autocast casts ``scaled_dot_product_attention``'s (floating tensors of the autocast device,
float64 excepted, to its lower precision).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten
# ATen's SDPBackend numbering, as _fused_sdp_choice returns it
FLASH, EFFICIENT, CUDNN = 1, 2, 3
MASK_ALIGNMENT = 16  # memory-efficient attention reads a bias with strides of this multiple


class FusedAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` calls to :func:`scaled_dot_product_attention`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch._C._nn.scaled_dot_product_attention:
            return scaled_dot_product_attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    enable_gqa: bool = False,
) -> torch.Tensor:
    query, key, value, attn_mask = _autocast(query, key, value, attn_mask)
    args = (query, key, value, attn_mask, dropout_p, is_causal, scale)
    choice = _fused_choice(*args, enable_gqa) if _may_fuse(*args, enable_gqa) else None
    if attn_mask is not None and attn_mask.dtype == torch.bool and choice is not None:
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
    if choice == CUDNN:
        return aten._scaled_dot_product_cudnn_attention(
            query, key, value, attn_mask, _needs_logsumexp(query, key, value), dropout_p,
            is_causal, False, scale=scale,
        )[0]  # fmt: skip
    if choice == FLASH and attn_mask is None and query.size(-1) % 8 == 0:
        return aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
    if choice == EFFICIENT and _aligned(attn_mask):
        if attn_mask is not None:
            attn_mask = attn_mask.expand(*query.shape[:-1], key.size(-2))
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, _needs_logsumexp(query, key, value), dropout_p,
            is_causal, scale=scale,
        )[0]  # fmt: skip
    return torch._C._nn.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


def _autocast(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """``tensors`` as autocast casts the arguments of ``scaled_dot_product_attention``."""
    device_type = tensors[0].device.type
    if device_type != "cuda" or not torch.is_autocast_enabled(device_type):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device_type)

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        eligible = (
            t is not None
            and t.is_floating_point()
            and t.dtype not in (torch.float64, dtype)
            and t.device.type == device_type
        )
        return t.to(dtype) if eligible else t

    return [cast(t) for t in tensors]


def _may_fuse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> bool:
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    return (
        query.device.type == "cuda"
        and torch.cuda.is_available()
        and dropout_p == 0.0
        and not (enable_gqa and key.size(-3) != query.size(-3))
        and all(isinstance(n, int) for t in tensors for n in (*t.shape, *t.stride()))
    )


def _fused_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> int:
    """ATen's backend choice for real tensors laid out like these (0 is the math form)."""

    def probe(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    with _disable_current_modes():
        return torch._fused_sdp_choice(
            probe(query), probe(key), probe(value), probe(attn_mask), dropout_p, is_causal,
            scale=scale, enable_gqa=enable_gqa,
        )  # fmt: skip


def _needs_logsumexp(*tensors: torch.Tensor) -> bool:
    """The fused ops return the logsumexp their backward reads only when asked to."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _aligned(mask: torch.Tensor | None) -> bool:
    return mask is None or (
        mask.stride(-1) in (0, 1) and all(s % MASK_ALIGNMENT == 0 for s in mask.stride()[:-1])
    )
