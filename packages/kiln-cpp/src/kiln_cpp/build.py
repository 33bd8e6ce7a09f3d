"""The compiler driver: one shared library per graph, cached on disk, loaded with ctypes.

A library lives in ``<cache>/<key>/kernels.so`` with ``kernels.cpp`` beside it, where the
key hashes the source, the flags and the compiler's version. The library is written under a
temporary name and renamed into place, with a ``kernels.so.sha256`` of its bytes written the
same way after it: an entry whose checksum is missing or wrong is rebuilt, never loaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kiln_cpp.errors import CppCompileError

CXX_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-w")
LIBRARY = "kernels.so"


def cache_dir() -> Path:
    """``$KILN_CPP_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln/cpp`` (``~/.cache/kiln/cpp``)."""
    if os.environ.get("KILN_CPP_CACHE_DIR"):
        return Path(os.environ["KILN_CPP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kiln" / "cpp"


def compiler() -> str:
    """The C++ compiler: ``$KILN_CXX``, else ``$CXX``, else ``g++``, resolved on PATH."""
    name = os.environ.get("KILN_CXX") or os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        raise CppCompileError(
            f"no C++ compiler: {name!r} is not on PATH. Install g++ (or set KILN_CXX to a "
            "C++17 compiler with OpenMP), or run the graph eagerly"
        )
    return path


@functools.cache
def _compiler_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CppCompileError(f"the C++ compiler {path} does not run: {exc}") from exc
    return out.stdout.strip()


def cache_key(source: str, cxx: str) -> str:
    h = hashlib.sha256()
    for part in (source, " ".join(CXX_FLAGS), _compiler_version(cxx)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def cached_library(entry: Path) -> Path | None:
    """The entry's library if it is complete and its checksum matches, else None."""
    lib, digest = entry / LIBRARY, entry / (LIBRARY + ".sha256")
    try:
        if lib.is_file() and digest.read_text().strip() == _sha256(lib):
            return lib
    except OSError:
        pass
    return None


def build(source: str) -> tuple[Path, bool]:
    """The shared library of ``source``: ``(path, built)`` where ``built`` is False for a
    cache hit. Raises :class:`CppCompileError` when the compiler is missing or fails."""
    cxx = compiler()
    entry = cache_dir() / cache_key(source, cxx)
    lib = cached_library(entry)
    if lib is not None:
        return lib, False
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "kernels.cpp").write_text(source)
    fd, tmp = tempfile.mkstemp(dir=entry, prefix=LIBRARY + ".tmp", suffix=".so")
    os.close(fd)
    cmd = [cxx, *CXX_FLAGS, str(entry / "kernels.cpp"), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CppCompileError(
                f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        os.replace(tmp, entry / LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _write_atomic(entry / (LIBRARY + ".sha256"), _sha256(entry / LIBRARY).encode())
    return entry / LIBRARY, True


def load(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
