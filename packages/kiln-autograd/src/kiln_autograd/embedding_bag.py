"""``embedding_bag`` in every mode, and its backwards, as ops that fuse.

Each index finds its bag by a binary search of the offsets (``searchsorted``); its row is
gathered, weighted and scatter-added into the bag. The backward gathers each index's bag
gradient and scatter-adds it into the weight's rows. The bag of each index is worked out
again in the backward rather than read from ``offset2bag``, which eager leaves empty on
its fast path.

Mode ``max`` reduces a (bags x indices) table of the rows, masked to each bag: an ``amax``
and an ``argmax`` (the first maximum, the first NaN: eager's rule), so its cost grows with
bags times indices and a large bag table (more than :data:`MAX_MODE_TABLE` entries) keeps
ATen's kernel. Its backward scatter-adds each bag's gradient into the row that was its
maximum. Sparse gradients and ``scale_grad_by_freq`` keep ATen's kernels (extern calls):
the CPU kernel's frequency scaling divides by the count of another index than the row's own.
"""

from __future__ import annotations

import torch
from torch._meta_registrations import meta_embedding_bag

from kiln_autograd.decompositions import register_decomposition

aten = torch.ops.aten
MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2
# mode max builds a (bags x indices) table: above this many entries ATen's kernel runs
MAX_MODE_TABLE = 1 << 16


def _bags(indices, offsets, num_bags: int, padding_idx: int):
    """Each index's bag (0 where it is in none) and whether it counts: it is in a bag
    (not past an end given as the last offset) and is not ``padding_idx``."""
    positions = torch.arange(indices.shape[0], device=indices.device, dtype=offsets.dtype)
    bag = aten.searchsorted.Tensor(offsets, positions, right=True) - 1
    keep = bag < num_bags
    if padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    return torch.where(keep, bag, 0), keep


def _counts(bag, keep, num_bags: int, like: torch.Tensor) -> torch.Tensor:
    return like.new_zeros(num_bags).scatter_add(0, bag, keep.to(like.dtype))


@register_decomposition(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=MODE_SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    if indices.dim() != 1:
        return NotImplemented
    args = (scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset)
    # the auxiliary outputs take eager's shapes (they differ by device and path)
    meta = meta_embedding_bag(weight, indices, offsets, *args, padding_idx)
    num_bags = meta[0].shape[0]
    if mode == MODE_MAX and not _small_table(num_bags, indices.shape[0]):
        return NotImplemented
    bag, keep = _bags(indices, offsets, num_bags, padding_idx)
    if mode == MODE_MAX:
        return _embedding_bag_max(weight, indices, bag, keep, num_bags, meta)
    rows = aten.index_select.default(weight, 0, indices)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    rows = torch.where(keep.unsqueeze(1), rows, 0)
    output = weight.new_zeros(num_bags, weight.shape[1])
    output = output.scatter_add(0, bag.unsqueeze(1).expand_as(rows), rows)
    counts = _counts(bag, keep, num_bags, offsets)
    if mode == MODE_MEAN:
        output = output / counts.clamp(min=1).unsqueeze(1).to(output.dtype)
    return output, *_auxiliary(meta[1:], bag, counts, mode, weight.device)


def _small_table(num_bags, num_indices) -> bool:
    sizes = (num_bags, num_indices)
    return all(isinstance(n, int) for n in sizes) and num_bags * num_indices <= MAX_MODE_TABLE


def _embedding_bag_max(weight, indices, bag, keep, num_bags, meta):
    """Each bag's largest row entries and the rows they come from (0 for an empty bag)."""
    bags = torch.arange(num_bags, device=indices.device, dtype=bag.dtype)
    in_bag = (bag.unsqueeze(0) == bags.unsqueeze(1)) & keep.unsqueeze(0)  # (bags, indices)
    rows = aten.index_select.default(weight, 0, indices)
    table = torch.where(in_bag.unsqueeze(2), rows.unsqueeze(0), float("-inf"))
    counts = in_bag.sum(1)
    output = torch.where(counts.unsqueeze(1) > 0, table.amax(1), 0)
    # a bag whose maximum is -inf (or that is empty) takes its first index: the -inf of
    # another bag's entries would tie with it
    position = table.argmax(1)
    first = in_bag.to(torch.int8).argmax(1, keepdim=True).expand_as(position)
    position = torch.where(in_bag.gather(1, position), position, first)
    max_indices = torch.where(counts.unsqueeze(1) > 0, indices[position], 0)
    offset2bag = bag.to(meta[1].dtype) if meta[1].shape == bag.shape else torch.zeros_like(meta[1])
    return output, offset2bag, counts.to(meta[2].dtype), max_indices.to(meta[3].dtype)


def _auxiliary(meta, bag, counts, mode, device) -> tuple[torch.Tensor, ...]:
    """offset2bag, bag_size and max_indices with eager's values where eager fills them."""
    offset2bag, bag_size, max_indices = (torch.zeros_like(t) for t in meta)
    if offset2bag.shape == bag.shape:
        offset2bag = bag.to(offset2bag.dtype)
    counted = mode == MODE_MEAN or device.type != "cpu"  # CPU leaves a sum's sizes at zero
    if counted and bag_size.shape == counts.shape:
        bag_size = counts.to(bag_size.dtype)
    if mode == MODE_MEAN and device.type == "cpu" and max_indices.shape == bag_size.shape:
        max_indices = bag_size.to(max_indices.dtype)
    return offset2bag, bag_size, max_indices


def _bag_gradients(grad, indices, offsets, mode, per_sample_weights, padding_idx):
    """The gradient each index's row receives, and each index's bag and whether it counts."""
    num_bags = grad.shape[0]
    bag, keep = _bags(indices, offsets, num_bags, padding_idx)
    rows = aten.index_select.default(grad, 0, bag)
    if mode == MODE_MEAN:
        counts = _counts(bag, keep, num_bags, offsets).clamp(min=1)
        rows = rows / aten.index_select.default(counts, 0, bag).unsqueeze(1).to(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    return torch.where(keep.unsqueeze(1), rows, 0), bag, keep


@register_decomposition(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    if sparse or scale_grad_by_freq:
        # ATen's CPU kernel scales by the count of an index other than the row's own
        return NotImplemented
    if mode == MODE_MAX:
        # each bag's gradient goes to the row its maximum came from; empty bags give none
        counted = (bag_size > 0).unsqueeze(1)
        rows = torch.where(counted, maximum_indices, 0)
        grad_weight = grad.new_zeros(num_weights, grad.shape[1])
        return grad_weight.scatter_add(0, rows, torch.where(counted, grad, 0))
    rows, _, _ = _bag_gradients(grad, indices, offsets, mode, per_sample_weights, padding_idx)
    grad_weight = grad.new_zeros(num_weights, grad.shape[1])
    return grad_weight.scatter_add(0, indices.unsqueeze(1).expand_as(rows), rows)


@register_decomposition(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    if mode != MODE_SUM:
        return NotImplemented
    rows, _, keep = _bag_gradients(grad, indices, offsets, mode, None, padding_idx)
    weighted = (rows * aten.index_select.default(weight, 0, indices)).sum(1)
    return torch.where(keep, weighted, 0)
