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


class CopyPlan:
    """How to copy tensors of the given byte sizes, worked out once (a graph copies the
    same sizes at every replay): which ones alone, which in one multi-tensor copy."""

    def __init__(self, nbytes: Sequence[int]) -> None:
        large = [i for i, n in enumerate(nbytes) if n >= ALONE_BYTES]
        self.alone = large if len(large) <= MAX_ALONE else []
        alone = set(self.alone)
        self.together = [i for i in range(len(nbytes)) if i not in alone]

    def __call__(self, targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
        """``targets[i].copy_(sources[i])`` for every ``i``."""
        if not self.alone:
            torch._foreach_copy_(targets, sources)
            return
        for i in self.alone:
            targets[i].copy_(sources[i])
        if self.together:
            together = self.together
            torch._foreach_copy_([targets[i] for i in together], [sources[i] for i in together])
