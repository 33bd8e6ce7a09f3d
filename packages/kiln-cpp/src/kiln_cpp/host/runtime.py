"""The host runtime: ``runtime.cpp`` built once per installation into a Python module.

It is the one part of kiln-cpp compiled against libtorch's headers (a slow build, about
15 s); the host programs of graphs include only ``kiln_host.h`` and get the runtime's
functions as a table when they load, so each graph's build stays as cheap as its kernels'.

The module lives in ``<folder>/<key>/``, keyed by the source, torch's version and ABI,
Python's version and the compiler, where ``<folder>`` is the first that applies:

1. ``$KILN_CPP_RUNTIME_DIR``;
2. the installation's own folder, ``kiln_cpp/host/build/`` beside this file, where this
   user owns the installation and nobody else can write to it: the runtime is part of the
   installation, built once, whatever cache folder the compiles use (an empty cache does
   not build it again);
3. ``<root>/runtime`` (the cache root, see :mod:`kiln_cpp.cache_dirs`; made private,
   refused where others can write).

A build is written under a temporary name and renamed into place, under a file lock.
:func:`start_loading` begins the build (where there is one to do) in a thread of its own,
so that a first compile's capture and lowering run while the compiler works; the first
:func:`load_runtime` then waits for it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
from pathlib import Path

import torch

from kiln_cpp import build, cache_dirs
from kiln_cpp.errors import CppCompileError
from kiln_loopir.cache_folders import make_private, unsafe_reason

HERE = Path(__file__).parent
SOURCE = HERE / "runtime.cpp"
HEADER = HERE / "kiln_host.h"
PARTS = [HERE / "cuda_gemm.h"]  # included by the source
MODULE = "kiln_host_runtime"
INSTALLED = HERE / "build"  # the installation's own folder for the runtime


def runtime_dir() -> Path:
    """``$KILN_CPP_RUNTIME_DIR``, else the installation's folder where it can be used,
    else ``<root>/runtime`` (see the module's docstring)."""
    if not os.environ.get("KILN_CPP_RUNTIME_DIR"):
        installed = installed_folder()
        if installed is not None:
            return installed
    return cache_dirs.usable_folder("KILN_CPP_RUNTIME_DIR", "runtime")


@functools.cache
def installed_folder() -> Path | None:
    """``kiln_cpp/host/build/``, made private, where this user owns the installation and
    nobody else can write to it; else None."""
    try:
        if unsafe_reason(HERE) is not None or not os.access(HERE, os.W_OK):
            return None
        make_private(INSTALLED)
        if unsafe_reason(INSTALLED) is not None:
            return None
    except OSError:
        return None
    return INSTALLED


def _torch_paths() -> tuple[list[str], str]:
    root = Path(torch.__file__).parent
    include = root / "include"
    includes = [str(include), str(include / "torch" / "csrc" / "api" / "include")]
    return includes, str(root / "lib")


def _flags(cxx: str) -> list[str]:
    includes, lib = _torch_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        "-O2",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in includes),
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{HERE}",
        f"-L{lib}",
        f"-Wl,-rpath,{lib}",
        "-lc10",
        "-ltorch_cpu",
        "-ltorch_python",
    ]


def _key(cxx: str) -> str:
    h = hashlib.sha256()
    for part in (
        SOURCE.read_text(),
        HEADER.read_text(),
        *(part.read_text() for part in PARTS),
        torch.__version__,
        sys.version,
        build._compiler_version(cxx),
        " ".join(_flags(cxx)),
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _build(cxx: str, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".tmp", suffix=".so")
    os.close(fd)
    cmd = [cxx, str(SOURCE), "-o", tmp, *_flags(cxx)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CppCompileError(
                f"building kiln-cpp's host runtime failed (exit {proc.returncode}):\n"
                f"{' '.join(cmd)}\n{proc.stderr[-4000:]}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_FAILED: list[Exception] = []  # the first failure, raised again without building again
_LOADING = threading.Lock()  # one thread builds and loads; the others wait for it
_STARTED: list[threading.Thread] = []


def load_runtime() -> types.ModuleType:
    """The runtime module, built on first use (raises :class:`CppCompileError` when the
    compiler or torch's headers are missing: once per process, the same error after)."""
    with _LOADING:
        if _FAILED:
            raise _FAILED[0]
        try:
            return _load_runtime()
        except Exception as exc:
            _FAILED.append(exc)
            raise


def start_loading() -> None:
    """Build and load the runtime in a background thread, once per process: the build
    (about 15 s where the installation has none yet) then overlaps whatever the caller
    does until its first :func:`load_runtime`, which waits for it and raises what it
    raised. The thread then asks the compiler which optional flags it takes
    (``build.optional_flags``: a few compiler runs where the cache has no answer yet),
    which the first build of a library would otherwise wait for."""
    if _STARTED or _FAILED or _load_runtime.cache_info().currsize:
        return
    thread = threading.Thread(target=_load_quietly, name="kiln-cpp-runtime", daemon=True)
    _STARTED.append(thread)
    thread.start()


def _load_quietly() -> None:
    with contextlib.suppress(Exception):  # kept in _FAILED: the next load_runtime raises it
        load_runtime()
    with contextlib.suppress(Exception):  # no compiler: the first build says so
        build.optional_flags(build.compiler())


@functools.cache
def _load_runtime() -> types.ModuleType:
    cxx = build.compiler()
    entry = runtime_dir() / _key(cxx)
    target = entry / f"{MODULE}.so"
    if not target.is_file():
        entry.mkdir(mode=0o700, exist_ok=True)
        with open(entry / "build.lock", "w") as lock:
            if build.fcntl is not None:
                build.fcntl.flock(lock, build.fcntl.LOCK_EX)
            if not target.is_file():
                _build(cxx, target)
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(target))
    spec = importlib.util.spec_from_file_location(MODULE, target, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
