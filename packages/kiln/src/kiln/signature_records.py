"""kiln-autograd's signature records in Kiln's on-disk cache: a warm start does not trace.

``kiln_autograd.aot(..., cache=...)`` stores each traced signature's aten graphs as a
record (data only: ``torch.save`` of plain containers, read with ``weights_only=True``)
and rebuilds them from it in a later process. :class:`SignatureRecords` keeps those
records as ``<root>/graphs/<key[:2]>/<key>.record``, written and bounded like the graph
entries (:class:`kiln.cache.GraphCache`: checksummed, private, atomic, least recently used
evicted). Kiln's key adds to kiln-autograd's its own settings that change the graphs
kiln-autograd is asked for (the partitioner) or where their compiled entries lie (fusion,
memory reuse, autotuning, code generator), the record format and Kiln's versions.

The graphs of a restored record are compiled from the graph cache only
(:class:`kiln.pipeline.AtenCompiler` raises ``kiln_autograd.NeedsTrace`` for one it does not
find there, and kiln-autograd traces that signature as before). Reading a record is charged
to the ``autograd_cache`` stage of :func:`kiln.compile_times`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kiln.cache import FORMAT, RECORD_SUFFIX, GraphCache, versions
from kiln.config import Config
from kiln.frames import Frame

RECORD_FORMAT = 1  # how a record's file is named and keyed (kiln-autograd versions its data)


class SignatureRecords:
    """kiln-autograd's ``cache=`` for one frame: records by key, beside the graph entries."""

    def __init__(self, root: Path, config: Config, frame: Frame) -> None:
        self.files = GraphCache(root)
        self.frame = frame
        options = config.options
        # the partitioner changes the graphs; the rest, where their compiled entries are (a
        # record whose graphs were compiled under other settings would be traced again)
        settings = {"partitioner": options.partitioner, **options.code_settings(),
                    "codegen": options.codegen}  # fmt: skip
        self.settings = " ".join(f"{k}={v!r}" for k, v in settings.items())

    def path(self, key: str) -> Path:
        """The file of kiln-autograd's ``key``."""
        parts = [
            f"record format {RECORD_FORMAT} graphs format {FORMAT}",
            key,
            self.settings,
            versions(),
        ]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
        return self.files.root / digest[:2] / f"{digest}{RECORD_SUFFIX}"

    def load(self, key: str) -> bytes | None:
        with self.frame.stage("autograd_cache"):
            return self.files.read(self.path(key))

    def store(self, key: str, data: bytes) -> None:
        if self.frame.ran_eagerly:  # a graph without a cache entry: a later start would trace
            return
        with self.frame.stage("autograd_cache"):
            self.files.write(self.path(key), data)
