"""Seeing, in an eager run, whether a callable waits for the GPU from the host.

A CUDA graph cannot capture a host synchronisation (``.item()``, ``.cpu()``, ``nonzero``,
a copy from pageable host memory): the capture fails, and torch leaves its CUDA random
number generator expecting a capture that never ends. So before a capture, the eager run
of the same call is watched with torch's sync debug mode set to ``"warn"``: each
synchronising operation torch knows of then warns (``"called a synchronizing CUDA
operation"``) and still completes, so the run's result stays valid and nothing runs
twice.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

SYNC_WARNING = "called a synchronizing CUDA operation"
# what torch says once when the mode is first set: the watch's own, never the user's
MODE_NOTICE = "Synchronization debug mode is a prototype feature"
_DEFAULT, _WARN = 0, 1  # torch.cuda.get_sync_debug_mode's values ("error" is 2)


@contextmanager
def watching_host_syncs() -> Iterator[list[str]]:
    """Yields a list that holds, once the block ends, the synchronisations it made.

    The previous sync debug mode comes back on exit. A mode the user set is respected:
    under ``"error"`` a synchronisation raises as it would without the watch; under
    ``"warn"`` its warnings are shown as well as recorded. Other warnings of the block are
    shown as they would have been; torch's notice on setting the mode is not."""
    found: list[str] = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if previous == _DEFAULT:
            torch.cuda.set_sync_debug_mode(_WARN)
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    for warning in caught:
        if previous == _DEFAULT and MODE_NOTICE in str(warning.message):
            continue
        is_sync = SYNC_WARNING in str(warning.message)
        if is_sync:
            found.append(str(warning.message))
        if not is_sync or previous == _WARN:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )


def run_watching_host_syncs(fn: Callable[[], object]) -> tuple[object, str | None]:
    """``fn()`` and the first host synchronisation it made, or None."""
    with watching_host_syncs() as syncs:
        result = fn()
    return result, (syncs[0] if syncs else None)
