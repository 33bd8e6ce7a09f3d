"""kiln-capture's kept captures in Kiln's on-disk cache: a warm start does not trace bytecode.

``kiln_capture.capture(..., kept=...)`` keeps what a capture made of a frame (its guards,
the graph's inputs, the code after the graph, the files it traced) and, in a later process,
checks the kept guards instead of tracing (:mod:`kiln_capture.kept_captures`). This store
keeps them as ``<root>/graphs/<key[:2]>/<key>.capture``, written, checked and evicted as
the graph entries are (:class:`kiln.cache.GraphCache`). Kiln's key adds to kiln-capture's
every setting of the ``kiln.compile`` call that changes what is compiled (the backend, the
mode, the options) and the versions.

The compiled graph of a kept capture is restored by kiln-autograd from its signature
record (:func:`kiln_autograd.restore`, by the token :func:`kiln.pipeline.aot_backend` put
on the captured graph), its aten graphs from the graph cache: where any of them is gone,
the frame is traced as before. Restoring is charged to the ``autograd`` stage of
:func:`kiln.compile_times`, the rest of the first call to ``capture``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

import kiln_autograd
from kiln.cache import CAPTURE_SUFFIX, GraphCache, versions
from kiln.cache_folders import usable_root
from kiln.config import Config, cache_root
from kiln.frames import Frame
from kiln_loopir import compile_lock

FORMAT = 1
# options that do not change what is compiled, only where it is written or how it is told
NOT_KEYED = ("debug_dir", "cache", "cache_dir")


class CaptureStore:
    """kiln-capture's ``kept=`` for one ``kiln.compile`` call."""

    def __init__(self, root: Path, config: Config) -> None:
        self.files = GraphCache(root)
        self.config = config
        options = {
            f.name: getattr(config.options, f.name)
            for f in dataclasses.fields(config.options)
            if f.name not in NOT_KEYED
        }
        self.settings = (
            f"backend {config.backend!r} mode {config.mode!r} dynamic {config.dynamic!r} "
            f"fullgraph {config.fullgraph!r} options {sorted(options.items())!r}"
        )

    def path(self, key: str) -> Path:
        parts = [f"capture store {FORMAT}", key, self.settings, versions()]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
        return self.files.root / digest[:2] / f"{digest}{CAPTURE_SUFFIX}"

    def load(self, key: str) -> bytes | None:
        return self.files.read(self.path(key))

    def store(self, key: str, data: bytes) -> None:
        self.files.write(self.path(key), data)

    def restore(self, token: str, fn: Callable) -> Callable | None:
        """The compiled graph of a kept capture of ``fn``, from kiln-autograd's record and
        the graph cache; None where one of them is missing."""
        from kiln.pipeline import AtenCompiler, signature_records

        frame = Frame(self.config.options.debug_dir)
        frame.function = fn.__qualname__
        with compile_lock.compiling(), frame.stage("autograd"):
            restored = kiln_autograd.restore(
                token,
                AtenCompiler(self.config, frame, "forward", generate=True),
                AtenCompiler(self.config, frame, "backward", generate=True),
                cache=signature_records(self.config, frame),
            )
        if restored is not None:
            frame.log_perf("restored")
        return restored


def capture_store(config: Config) -> CaptureStore | None:
    """The store of ``config``'s kept captures, where the on-disk cache is on and the
    backend is Kiln's own (a user's backend compiles what it is given, every time). With a
    debug folder every frame is traced, so that its dumps (the captured graph, the guards)
    are all there."""
    options = config.options
    if not options.cache or options.debug_dir is not None or config.backend not in ("auto", "kiln"):
        return None
    root = usable_root(cache_root(config.options))  # None: refused, with a warning
    return CaptureStore(root, config) if root is not None else None
