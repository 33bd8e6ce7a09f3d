"""Where Kiln's on-disk caches lie by default, and the checks that keep them private.

Every package that writes a cache (kiln's graphs, kiln-cpp's libraries, kiln-triton's
kernels) puts it under one root: ``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else
``~/.cache/kiln``. The cache holds code that runs, so its folders are made private to the
user (mode 0o700) and a folder another user could write to is not used.
"""

from __future__ import annotations

import contextlib
import os
import stat
import warnings
from pathlib import Path


def default_root() -> Path:
    """``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``."""
    if os.environ.get("KILN_CACHE_DIR"):
        return Path(os.environ["KILN_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kiln"


def unsafe_reason(folder: Path) -> str | None:
    """Why another user could write into ``folder`` (an existing one), or None."""
    if not hasattr(os, "getuid"):
        return None  # not POSIX: no owner and mode bits to check
    info = folder.stat()
    if info.st_uid != os.getuid():
        return f"is owned by another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by others (mode {oct(stat.S_IMODE(info.st_mode))})"
    return None


def make_private(folder: Path) -> None:
    """Create ``folder`` and each missing parent with mode 0o700."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made by another process meanwhile
            path.mkdir(mode=0o700)


_refused: set[Path] = set()  # folders warned about in this process


def refuse(folder: Path, reason: str, package: str) -> None:
    """Warn, once per folder and process, that ``folder`` is not used as a cache (it
    ``reason``) and what to do; the caller compiles without it."""
    if folder in _refused:
        return
    _refused.add(folder)
    warnings.warn(
        f"{package}: not using the cache folder {folder}: it {reason}, so another user could "
        "put code there that Kiln would run. Make it yours and private (chmod 700), or set "
        "KILN_CACHE_DIR (or kiln's cache_dir option) to a private folder; compiling without "
        "the on-disk cache meanwhile",
        RuntimeWarning,
        stacklevel=3,
    )


def forget_refusals() -> None:
    """Warn again about folders refused before (tests)."""
    _refused.clear()
