"""Counters of what a wrapper did with its calls, per wrapper and for the whole process."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass
class CudaGraphStats:
    """What the calls of a wrapper (or of all wrappers) did.

    ``warmups``: first calls of a new input key, run eagerly; ``captures``: graphs recorded
    (re-recordings included); ``replays``: calls answered by a replay; ``eager_calls``:
    calls run without a graph after the warm-up, with ``reasons`` counting them per reason;
    ``failed_captures``: recordings given up (the eager run synchronised with the host,
    the capture raised, or its replay differed from eager); ``evictions``: keys dropped,
    least recently used first, to make room for a new one (``max_graphs``).
    """

    warmups: int = 0
    captures: int = 0
    replays: int = 0
    eager_calls: int = 0
    failed_captures: int = 0
    evictions: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def count_eager(self, reason: str) -> None:
        self.eager_calls += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def snapshot(self) -> CudaGraphStats:
        return copy.deepcopy(self)


PROCESS_TOTALS = CudaGraphStats()
