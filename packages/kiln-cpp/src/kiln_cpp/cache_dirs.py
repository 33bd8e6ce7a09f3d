"""Where kiln-cpp keeps what it builds, and the check that keeps it private.

A cache folder (``cpp`` for the libraries, ``runtime`` for the host runtime; kiln-triton
asks for ``triton`` the same way) is, the first that applies:

1. its own variable (``$KILN_CPP_CACHE_DIR``, ``$KILN_CPP_RUNTIME_DIR``);
2. ``<root>/<name>`` for the root set by :func:`cache_root` (kiln sets its ``cache_dir``
   option there for the duration of a compile);
3. ``$KILN_CACHE_DIR/<name>``;
4. ``$XDG_CACHE_HOME/kiln/<name>``, else ``~/.cache/kiln/<name>``.

The cache holds code that runs (shared libraries), so every folder made here is made
private to the user (mode 0o700), and a folder that another user can write to (group- or
world-writable, or owned by someone else) is refused, as is the root it lies under: one
``RuntimeWarning`` per folder names it and says what to do, and the builds go to a private
temporary folder removed at exit (compiled, just not cached).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from kiln_loopir.cache_folders import default_root, make_private, refuse, unsafe_reason

_UNSET = object()
# the root of the current compile: a Path, None (no on-disk cache), or _UNSET (the default)
_ROOT: ContextVar[object] = ContextVar("kiln_cache_root", default=_UNSET)


@contextmanager
def cache_root(root: str | os.PathLike | None) -> Iterator[None]:
    """Within it, cache folders lie under ``root`` (``<root>/cpp``, ``<root>/runtime``,
    ``<root>/triton``) unless their own variable is set; ``root=None`` turns the on-disk
    cache off (builds go to a private temporary folder). Per thread and per task; a build
    handed to kiln-cpp's thread pool carries the root with it."""
    token = _ROOT.set(None if root is None else Path(root).expanduser())
    try:
        yield
    finally:
        _ROOT.reset(token)


def locate(variable: str, name: str) -> tuple[Path | None, Path | None]:
    """``(folder, root)``: where the cache ``name`` lies and the root it lies under (None
    for a folder given by ``variable``); ``(None, None)`` where the cache is turned off."""
    if os.environ.get(variable):
        return Path(os.environ[variable]).expanduser(), None
    root = _ROOT.get()
    if root is None:
        return None, None
    if root is _UNSET:
        root = default_root()
    return root / name, root


def private_folder(variable: str, name: str, package: str = "kiln-cpp") -> Path | None:
    """The cache folder ``name`` (see :func:`locate`), created private; None where it is
    turned off or refused (with a warning: see :func:`refuse`)."""
    folder, root = locate(variable, name)
    if folder is None:
        return None
    try:
        for path in (root, folder) if root is not None else (folder,):
            make_private(path)  # the root is checked before anything is made in it
            reason = unsafe_reason(path)
            if reason is not None:
                refuse(path, reason, package)
                return None
    except OSError as exc:
        refuse(folder, f"cannot be used ({exc})", package)
        return None
    return folder


def usable_folder(variable: str, name: str, package: str = "kiln-cpp") -> Path:
    """:func:`private_folder`, else ``name`` in a private temporary folder removed at exit."""
    folder = private_folder(variable, name, package)
    if folder is None:
        folder = _scratch() / name
        folder.mkdir(mode=0o700, exist_ok=True)
    return folder


@functools.cache
def _scratch() -> Path:
    path = Path(tempfile.mkdtemp(prefix="kiln-nocache-"))  # mode 0o700
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
