"""The cache root and its parts: where they lie, the check that keeps them private, and
:func:`cache_info` / :func:`clear_cache` (``python -m kiln cache info|clear``).

One root holds every on-disk cache of Kiln (``$KILN_CACHE_DIR`` or the ``cache_dir``
option, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``)::

    <root>/graphs/   compiled graphs (kiln.cache)
    <root>/cpp/      kiln-cpp's shared libraries ($KILN_CPP_CACHE_DIR moves them)
    <root>/runtime/  kiln-cpp's host runtime, where its installation cannot hold it
                     ($KILN_CPP_RUNTIME_DIR moves it)
    <root>/triton/   kiln-triton's kernels and autotuning winners ($KILN_TRITON_CACHE_DIR)
    <root>/timings/  the graph rewrites' decisions timed on the device (kiln.device_timing)

The cache holds code Kiln runs, so folders are made private to the user (mode 0o700), and a
root that another user can write to (group- or world-writable, or owned by someone else) is
refused: one ``RuntimeWarning`` names it and says what to do, and the compile runs without
the on-disk cache (the code generators get no root either: they build in a private
temporary folder).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from kiln_loopir.cache_folders import default_root, make_private, refuse, unsafe_reason

# each part: its folder under the root, and the variable that moves it elsewhere
PARTS = {
    "graphs": None,
    "cpp": "KILN_CPP_CACHE_DIR",
    "runtime": "KILN_CPP_RUNTIME_DIR",
    "triton": "KILN_TRITON_CACHE_DIR",
    "timings": None,
}


def part_folder(root: Path, name: str) -> Path:
    """Where the part ``name`` of the cache under ``root`` lies (its variable, if set)."""
    variable = PARTS[name]
    if variable and os.environ.get(variable):
        return Path(os.environ[variable]).expanduser()
    return root / name


def usable_root(root: Path) -> Path | None:
    """``root``, created private, or None (with one warning per folder and process) where
    another user could write to it or it cannot be created."""
    try:
        make_private(root)
        reason = unsafe_reason(root)
    except OSError as exc:
        reason = f"cannot be used ({exc})"
    if reason is None:
        return root
    refuse(root, reason, "kiln")
    return None


@dataclass(frozen=True)
class CachePart:
    """One part of the cache: its folder, its size in bytes and how many entries it holds
    (graphs and signature records; libraries; runtime builds; kernel files and autotuning
    winners; timed decisions)."""

    name: str
    path: Path
    size_bytes: int
    entries: int


@dataclass(frozen=True)
class CacheInfo:
    """What :func:`cache_info` found: the root and each part of the cache."""

    root: Path
    parts: tuple[CachePart, ...]

    @property
    def size_bytes(self) -> int:
        return sum(part.size_bytes for part in self.parts)

    def __str__(self) -> str:
        lines = [f"root     {self.root}"]
        for part in self.parts:
            lines.append(
                f"{part.name:<8} {_megabytes(part.size_bytes):>10}  {part.entries:>6} entries  "
                f"{part.path}"
            )
        lines.append(f"{'total':<8} {_megabytes(self.size_bytes):>10}")
        return "\n".join(lines)


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.1f} MB"


def _entries(name: str, folder: Path) -> int:
    if name == "graphs":
        # compiled graphs, kiln-autograd's signature records (kiln.signature_records), the
        # rewrites' records (kiln.rewrite_records) and kept captures (kiln.capture_store)
        suffixes = (".pt", ".record", ".rewrites", ".capture")
        return sum(1 for p in folder.rglob("*") if p.suffix in suffixes)
    if name == "triton":
        return sum(1 for p in folder.rglob("*") if p.suffix in (".py", ".json"))
    if name == "timings":
        return sum(1 for p in folder.glob("*.json"))
    return sum(1 for p in folder.iterdir() if p.is_dir())  # one folder per library / build


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):  # removed meanwhile
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


def cache_info(cache_dir: str | os.PathLike | None = None) -> CacheInfo:
    """The cache under ``cache_dir`` (default: :func:`default_root`): each part's folder,
    size and entries. Nothing is created."""
    root = Path(cache_dir).expanduser() if cache_dir else default_root()
    parts = []
    for name in PARTS:
        folder = part_folder(root, name)
        found = folder.is_dir()
        parts.append(
            CachePart(
                name,
                folder,
                _size(folder) if found else 0,
                _entries(name, folder) if found else 0,
            )
        )
    return CacheInfo(root, tuple(parts))


def clear_cache(cache_dir: str | os.PathLike | None = None) -> CacheInfo:
    """Remove every part of the cache under ``cache_dir`` (default: :func:`default_root`),
    and the root where nothing else is left in it; asks nothing. Returns what was there.
    Graphs already loaded in this process keep running."""
    info = cache_info(cache_dir)
    for part in info.parts:
        shutil.rmtree(part.path, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty (files of someone else), or gone
        info.root.rmdir()
    return info
