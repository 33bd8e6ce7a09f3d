"""The op-coverage corpus: neural-network ops (padding modes, interpolation modes,
unfold/fold, convolutions, pooling incl. adaptive (average pooling and max pooling's
backward as kernels), one_hot, embeddings and embedding bags in
every mode, losses and normalizations). See test_op_coverage.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_corpus import LOOSE, Frame, check_frame

# 13 indices in 4 bags, the second one empty (and the last offset the end, where it is given)
BAG_INDICES = torch.tensor([1, 3, 4, 3, 10, 0, 7, 7, 2, 9, 3, 5, 8])
BAG_OFFSETS = torch.tensor([0, 4, 4, 9, 13])
TARGETS = torch.tensor([2, 0, 4, 1])


# adaptive average pooling decomposes; its backward runs through ATen unless the windows
# tile the input
_ADAPTIVE_AVG = {"fused": True, "externs": ("aten._adaptive_avg_pool2d_backward",)}


def _bag(w, **kwargs):
    return F.embedding_bag(BAG_INDICES, w, BAG_OFFSETS, **kwargs)


FRAMES = {
    "pad_constant": Frame(
        lambda x: F.pad(x.sin(), (1, 2, 0, 1), value=0.5), ((2, 3, 4),), fused=True
    ),
    "pad_reflect_1d": Frame(
        lambda x: F.pad(x, (2, 1), mode="reflect") * 2, ((2, 3, 5),), fused=True
    ),
    "pad_reflect_2d": Frame(
        lambda x: F.pad(x.exp(), (1, 1, 2, 0), mode="reflect"), ((1, 2, 4, 5),), fused=True
    ),
    "pad_replicate_2d": Frame(
        lambda x: F.pad(x.sin(), (2, 0, 1, 3), mode="replicate") + 1,
        ((1, 2, 3, 4),),
        fused=True,
        externs=("aten.replication_pad2d_backward",),
    ),
    "pad_replicate_3d": Frame(
        lambda x: F.pad(x.exp(), (1, 1, 0, 1, 1, 0), mode="replicate"),
        ((1, 1, 2, 3, 3),),
        fused=True,
        externs=("aten.replication_pad3d_backward",),
    ),
    "pad_circular_2d": Frame(
        lambda x: F.pad(x.cos(), (1, 2, 1, 0), mode="circular"), ((1, 2, 3, 4),), fused=True
    ),
    "interpolate_nearest": Frame(
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest") * 2, ((1, 2, 3, 4),), fused=True
    ),
    "interpolate_nearest_exact": Frame(
        lambda x: F.interpolate(x, size=(5, 7), mode="nearest-exact"), ((1, 2, 3, 4),), fused=True
    ),
    "interpolate_linear": Frame(
        lambda x: F.interpolate(x.sin(), size=9, mode="linear"), ((2, 3, 5),), fused=True
    ),
    "interpolate_bilinear_align_corners": Frame(
        lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True),
        ((1, 2, 4, 4),),
        fused=True,
    ),
    "interpolate_bilinear_downsample": Frame(
        lambda x: F.interpolate(x, size=(3, 2), mode="bilinear"), ((1, 1, 6, 5),), fused=True
    ),
    "interpolate_bicubic": Frame(
        lambda x: F.interpolate(x, size=(6, 5), mode="bicubic"), ((1, 2, 3, 4),), fused=True
    ),
    "interpolate_trilinear": Frame(
        lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), ((1, 1, 2, 3, 2),), fused=True
    ),
    "interpolate_area": Frame(
        # windows that tile the input: average pooling, forward and backward
        lambda x: F.interpolate(x.exp(), size=(2, 3), mode="area"),
        ((1, 2, 4, 6),),
        fused=True,
    ),
    # sizes as tuples: F.unfold's _pair(int) builds an itertools.repeat, a graph break
    "unfold": Frame(
        lambda x: F.unfold(x.sin(), (2, 2), (1, 1), (0, 0), (1, 1)) * 2, ((1, 2, 4, 5),), fused=True
    ),
    "unfold_dilation_padding": Frame(
        lambda x: F.unfold(x.exp(), (2, 3), (2, 2), (1, 1), (2, 2)), ((2, 1, 5, 6),), fused=True
    ),
    "fold": Frame(
        lambda x: F.fold(x.sin(), (4, 5), (2, 2), (1, 1), (0, 0), (1, 1)), ((1, 8, 12),), fused=True
    ),
    "tensor_unfold": Frame(lambda x: x.unfold(1, 3, 2).sum(-1) * x[:, :3], ((4, 7),), fused=True),
    "conv1d": Frame(lambda x, w: F.conv1d(x.sin(), w, padding=1).relu(), ((2, 3, 8), (4, 3, 3))),
    "conv2d_stride_dilation": Frame(
        lambda x, w: F.conv2d(x.sin(), w, stride=2, dilation=2, padding=2),
        ((1, 2, 7, 7), (3, 2, 3, 3)),
        **LOOSE,
    ),
    "conv2d_groups_bias": Frame(
        lambda x, w, b: F.conv2d(x, w.tanh(), b, groups=2) * 2,
        ((1, 4, 5, 5), (6, 2, 3, 3), (6,)),
        **LOOSE,
    ),
    "conv2d_depthwise_same": Frame(
        lambda x, w: F.conv2d(x.sin(), w, groups=3, padding="same").exp(),
        ((2, 3, 5, 5), (3, 1, 3, 3)),
        **LOOSE,
    ),
    "conv3d": Frame(
        lambda x, w: F.conv3d(x.cos(), w) * 2, ((1, 2, 4, 4, 4), (2, 2, 2, 2, 2)), **LOOSE
    ),
    "conv_transpose2d": Frame(
        lambda x, w: F.conv_transpose2d(x.sin(), w, stride=2, output_padding=1).tanh(),
        ((1, 3, 3, 4), (3, 2, 3, 3)),
        **LOOSE,
    ),
    "conv_transpose1d_groups": Frame(
        lambda x, w: F.conv_transpose1d(x.tanh(), w, groups=2), ((2, 4, 5), (4, 1, 3)), **LOOSE
    ),
    "max_pool1d": Frame(lambda x: F.max_pool1d(x, 3, 2) * 2, ((2, 3, 9),), fused=True),
    "max_pool2d": Frame(
        lambda x: torch.max_pool2d(x.sin(), 2) * x[..., ::2, ::2], ((1, 2, 6, 6),), fused=True
    ),
    "max_pool2d_padding_ceil": Frame(
        lambda x: torch.max_pool2d(x, 3, 2, 1, ceil_mode=True).exp(), ((1, 2, 6, 7),), fused=True
    ),
    "max_pool1d_indices": Frame(
        lambda x: torch.max_pool1d_with_indices(x.sin(), 2)[1] * 2, ((2, 3, 8),), False, True
    ),
    "max_pool3d": Frame(lambda x: torch.max_pool3d(x.sin(), 2) * 2, ((1, 1, 4, 4, 4),), fused=True),
    "max_pool3d_overlapping_ceil": Frame(
        lambda x: torch.max_pool3d(x.exp(), 3, 2, 1, ceil_mode=True), ((1, 2, 5, 4, 5),), fused=True
    ),
    "avg_pool2d": Frame(lambda x: F.avg_pool2d(x.exp(), 2) - 1, ((1, 2, 6, 6),), fused=True),
    "avg_pool2d_exclude_pad_ceil": Frame(
        lambda x: F.avg_pool2d(x.sin(), 3, 2, 1, ceil_mode=True, count_include_pad=False) * 2,
        ((1, 2, 6, 7),),
        fused=True,
    ),
    "avg_pool2d_divisor_override_float64": Frame(
        lambda x: F.avg_pool2d(x, (2, 3), (3, 1), 1, divisor_override=4),
        ((2, 3, 7, 6),),
        fused=True,
        dtype=torch.float64,
    ),
    "avg_pool2d_large_window": Frame(
        lambda x: F.avg_pool2d(x.exp(), 6, 1, 2, count_include_pad=False),
        ((1, 2, 9, 8),),
        fused=True,
    ),
    "avg_pool1d": Frame(lambda x: F.avg_pool1d(x.cos(), 4, 2) + 1, ((2, 3, 10),), fused=True),
    "avg_pool3d": Frame(
        lambda x: F.avg_pool3d(x.sin(), 3, 2, 1, ceil_mode=True, count_include_pad=False),
        ((1, 2, 5, 6, 5),),
        fused=True,
    ),
    "lp_pool2d": Frame(
        lambda x: F.lp_pool2d(x.abs() + 0.1, 2, (2, 2), (2, 2)), ((1, 2, 4, 4),), fused=True
    ),
    "adaptive_avg_pool1d": Frame(
        lambda x: F.adaptive_avg_pool1d(x.sin(), 4) * 2, ((2, 3, 10),), **_ADAPTIVE_AVG
    ),
    "adaptive_avg_pool2d": Frame(
        lambda x: F.adaptive_avg_pool2d(x.sin(), (3, 2)), ((1, 2, 7, 5),), **_ADAPTIVE_AVG
    ),
    "adaptive_avg_pool2d_global": Frame(
        lambda x: F.adaptive_avg_pool2d(x, 1).flatten(1) * 2, ((2, 3, 4, 4),), fused=True
    ),
    "adaptive_max_pool2d": Frame(
        lambda x: F.adaptive_max_pool2d(x.sin(), (2, 3)) * 2, ((1, 2, 5, 7),)
    ),
    "adaptive_max_pool1d_indices": Frame(
        lambda x: F.adaptive_max_pool1d(x, 3, return_indices=True)[1] + 1, ((2, 2, 8),), False
    ),
    "one_hot": Frame(
        lambda x: F.one_hot((x.abs() * 2).long().clamp(max=4), 5) * 2,
        ((3, 4),),
        False,
        True,
        externs=("aten._assert_async",),  # the classes' bounds check
    ),
    "one_hot_float_matmul": Frame(
        lambda x: F.one_hot(TARGETS, 5).float() @ x, ((5, 3),), fused=True
    ),
    "embedding_padding_idx": Frame(
        lambda w: F.embedding(BAG_INDICES[:6].view(2, 3), w, padding_idx=3) * 2,
        ((11, 4),),
        fused=True,
    ),
    "embedding_bag_sum": Frame(lambda w: _bag(w.sin(), mode="sum") * 2, ((11, 5),), fused=True),
    "embedding_bag_mean_padding": Frame(
        lambda w: _bag(w, mode="mean", padding_idx=3, include_last_offset=True).cos(),
        ((11, 6),),
        fused=True,
    ),
    "embedding_bag_per_sample_weights": Frame(
        lambda w, p: _bag(w, mode="sum", per_sample_weights=p.exp()), ((11, 3), (13,)), fused=True
    ),
    "embedding_bag_2d_input": Frame(
        lambda w: F.embedding_bag(BAG_INDICES[:12].view(4, 3), w * 3, mode="mean"),
        ((11, 4),),
        fused=True,
    ),
    "embedding_bag_max": Frame(lambda w: _bag(w.sin(), mode="max") * 2, ((11, 5),), fused=True),
    "embedding_bag_max_2d_input": Frame(
        lambda w: F.embedding_bag(BAG_INDICES[:12].view(3, 4), w, mode="max"),
        ((11, 3),),
        fused=True,
    ),
    "embedding_bag_max_last_offset_padding": Frame(
        lambda w: _bag(w, mode="max", include_last_offset=True, padding_idx=7).exp(),
        ((11, 4),),
        fused=True,
    ),
    "cross_entropy_label_smoothing": Frame(
        lambda x: F.cross_entropy(x, TARGETS, label_smoothing=0.1), ((4, 5),), fused=True
    ),
    "nll_loss_weighted": Frame(
        lambda x: F.nll_loss(x.log_softmax(1), TARGETS, torch.arange(1.0, 6.0)),
        ((4, 5),),
        fused=True,
    ),
    "kl_div_smooth_l1": Frame(
        lambda x, y: (
            F.kl_div(x.log_softmax(1), y.softmax(1), reduction="batchmean")
            + F.smooth_l1_loss(x, y, beta=0.5)
        ),
        ((4, 5), (4, 5)),
        fused=True,
    ),
    "cosine_similarity": Frame(
        lambda x, y: F.cosine_similarity(x, y.sin(), dim=1), ((4, 5), (4, 5)), fused=True
    ),
    "cdist": Frame(lambda x, y: torch.cdist(x.sin(), y) * 2, ((4, 3), (5, 3)), **LOOSE),
    "pdist": Frame(lambda x: F.pdist(x * 2), ((5, 3),), **LOOSE),
    "group_norm": Frame(lambda x: F.group_norm(x, 2) * 2, ((2, 4, 3, 3),), fused=True, **LOOSE),
    "instance_norm": Frame(lambda x: F.instance_norm(x.exp()), ((2, 3, 5),), fused=True, **LOOSE),
    "local_response_norm": Frame(lambda x: F.local_response_norm(x, 3), ((1, 4, 3, 3),), **LOOSE),
    "pixel_shuffle": Frame(lambda x: F.pixel_shuffle(x.sin(), 2), ((1, 8, 2, 3),), fused=True),
    "grid_sample": Frame(
        lambda x, g: F.grid_sample(x, g.tanh(), align_corners=False),
        ((1, 2, 4, 5), (1, 3, 3, 2)),
        **LOOSE,
    ),
    "affine_grid": Frame(
        lambda t: F.affine_grid(t, [1, 1, 3, 4], align_corners=False), ((1, 2, 3),), fused=True
    ),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    check_frame(name, FRAMES[name], tmp_path, caplog)
