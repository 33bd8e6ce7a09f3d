"""Copying many tensors at once, each at the speed of the device's memory."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# torch's multi-tensor copy splits its tensors into fixed-size chunks, a block each: a few
# large tensors give it few blocks (an image batch of 2.4 MB took 15 µs on an H100 that
# way, a copy of its own 2 µs). Tensors of ALONE_BYTES or more are copied one by one where
# there are at most MAX_ALONE of them; more give the multi-tensor copy blocks enough, and
# a copy each would cost a launch each (BERT's backward hands out 74 gradients that large).
ALONE_BYTES = 1 << 18
MAX_ALONE = 8


def copy_all(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """``targets[i].copy_(sources[i])`` for every ``i``, in as few launches as keep the
    copies at the memory's speed."""
    large = [i for i, t in enumerate(targets) if t.numel() * t.element_size() >= ALONE_BYTES]
    if not large or len(large) > MAX_ALONE:
        torch._foreach_copy_(targets, sources)
        return
    for i in large:
        targets[i].copy_(sources[i])
    alone = set(large)
    rest = [i for i in range(len(targets)) if i not in alone]
    if rest:
        torch._foreach_copy_([targets[i] for i in rest], [sources[i] for i in rest])
