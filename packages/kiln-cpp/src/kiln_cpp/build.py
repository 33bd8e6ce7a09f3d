"""The compiler driver: one shared library per graph, cached on disk, loaded with ctypes.

A library lives in ``<cache>/<key>/kernels.so`` with ``kernels.cpp`` beside it (or
``kernels0.cpp``, ``kernels1.cpp`` ... and ``host.cpp`` for a library of several
translation units, compiled to objects at once and linked: see :mod:`kiln_cpp.library`),
where the key hashes the sources, the flags, the compiler's version and the CPU features
``-march=native`` resolves to. The library is written under a temporary name and renamed
into place, with a ``kernels.so.sha256`` of its bytes written the same way after it: an
entry whose checksum is missing or wrong is rebuilt, never loaded.

Builds of different keys run concurrently (the compiler is a subprocess, so threads
overlap; :func:`build_async` runs one on a shared thread pool); builds of one key are
serialised by a lock per key, within the process and across processes (``flock`` on
``<cache>/<key>/build.lock``), so a library is compiled once and the others load it.

``<cache>`` is ``$KILN_CPP_CACHE_DIR``, else ``<root>/cpp`` (see :mod:`kiln_cpp.cache_dirs`:
the root kiln sets, ``$KILN_CACHE_DIR``, ``~/.cache/kiln``), made private to the user; a
folder other users can write to is refused with a warning and the library is built in a
temporary folder instead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

try:
    import fcntl
except ImportError:  # not POSIX: the per-process lock alone
    fcntl = None

from kiln_cpp import cache_dirs
from kiln_cpp.__about__ import __version__
from kiln_cpp.errors import CppCompileError

# -fno-math-errno and -fno-trapping-math change no result: they let the compiler vectorise
# sqrt and if-convert the NaN-propagating selects (errno and FP exception flags are unused)
CXX_FLAGS = (
    "-O3",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-march=native",
    "-w",
)
# a library of several translation units: each compiled to an object, then linked
OBJECT_FLAGS = (*(f for f in CXX_FLAGS if f != "-shared"), "-c")
LINK_FLAGS = ("-shared", "-fPIC", "-fopenmp")
# the host program (calls, no loops): its many early returns each release the tensors held,
# which the optimiser makes slow work of. A 12-layer BERT's forward host (1629 lines) builds
# in 8.3 s at -O3, 4.3 s at -O1 and 1.2 s at -Og (0.5 s at -O0), on two cores; a host call
# costs the same (its time is in the runtime's calls)
HOST_FLAGS = (*(f for f in OBJECT_FLAGS if f != "-O3"), "-Og")
# a host program that only launches GPU kernels and calls the runtime: nothing for the
# optimiser to gain. BERT-base's training step on the H100 machine's host: the forward's
# (1880 lines) builds in 0.97 s at -Og and 0.71 s at -O0, the backward's (3633 lines) in
# 2.26 s and 1.39 s
LAUNCH_HOST_FLAGS = (*(f for f in OBJECT_FLAGS if f != "-O3"), "-O0")
BUILD_THREADS = max(1, min(8, os.cpu_count() or 1))
_SIN_PROBE = (
    'extern "C" __attribute__((simd("notinbranch"), const)) float kiln_probe(float) '
    'noexcept __asm__("sinf");\n'
    'extern "C" void f(const float* a, float* o) {\n'
    "  for (int i = 0; i < 64; ++i) o[i] = kiln_probe(a[i]);\n}\n"
)
# flags kept where the compiler builds the probe with them: (compile flags, link flags, probe)
OPTIONAL_FLAGS = (
    # glibc's vector math library, declared to the compiler by kiln_cpp.vecmath
    (("-DKILN_LIBMVEC",), ("-lmvec",), _SIN_PROBE),
    # GCC's tuning leaves gather instructions out on CPUs with the gather data sampling fix:
    # an indexed load (gather, embedding) then runs scalar with its selects as branches, 3x
    # to 8x slower than with gathers on a 1024 x 256 gather + relu
    (("-mtune-ctrl=use_gather",), (), 'extern "C" int f() { return 0; }\n'),
)
LIBRARY = "kernels.so"
T = TypeVar("T")


def cache_dir() -> Path:
    """The library cache, created private to the user (see :mod:`kiln_cpp.cache_dirs`):
    ``$KILN_CPP_CACHE_DIR``, else ``<root>/cpp``; a temporary folder where it is refused."""
    return cache_dirs.usable_folder("KILN_CPP_CACHE_DIR", "cpp")


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
    """The compiler's ``--version`` output (remembered per compiler file, see
    :func:`remembered`)."""

    def ask() -> str:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise CppCompileError(f"the C++ compiler {path} does not run: {exc}") from exc
        return out.stdout.strip()

    return remembered("version", _compiler_file(path), ask, lambda v: isinstance(v, str))


@functools.cache
def cpu_features(path: str) -> str:
    """What ``-march=native`` means here: the compiler's resolved target options (GCC),
    else the CPU's flags from ``/proc/cpuinfo``, else the machine name. Remembered per
    compiler file and CPU (its identity and flags in ``/proc/cpuinfo``) where the CPU
    tells them, else asked in every process."""
    cpu = _cpu_identity()
    if cpu is None:
        return _resolve_native(path)
    parts = (*_compiler_file(path), cpu)
    return remembered("cpu", parts, lambda: _resolve_native(path), lambda v: isinstance(v, str))


def _resolve_native(path: str) -> str:
    try:
        out = subprocess.run(
            [path, "-march=native", "-Q", "--help=target"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if "-march=" in out:
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine() + " " + platform.processor()


# the lines of /proc/cpuinfo that say which CPU this is (not its clock or core number)
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags",
               "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision",
               "Features")  # fmt: skip


def _cpu_identity() -> str | None:
    """The first processor's identity and flags from ``/proc/cpuinfo``; None where there
    is none to read."""
    found = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the first processor
                name = line.split(":", 1)[0].strip()
                if name in _CPU_FIELDS:
                    found.append(line.strip())
    except OSError:
        return None
    return "\n".join(found) if any(ln.startswith(("flags", "Features")) for ln in found) else None


@functools.cache
def optional_flags(path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(compile flags, link flags)`` of :data:`OPTIONAL_FLAGS` that the compiler accepts
    here (``KILN_LIBMVEC``: glibc's ``libmvec`` links, see :mod:`kiln_cpp.vecmath`).

    Probing runs the compiler once per entry (about 0.13 s with g++), so its answer is
    remembered (see :func:`remembered`) per compiler file, C library, machine, kiln-cpp
    version and set of probes."""
    parts = (
        *_compiler_file(path),
        " ".join(platform.libc_ver()),
        platform.machine(),
        " ".join(CXX_FLAGS),
        repr(OPTIONAL_FLAGS),
    )
    accepted = remembered("probe", parts, lambda: _probe(path), _valid_probe)
    compile_flags: tuple[str, ...] = ()
    link_flags: tuple[str, ...] = ()
    for k in accepted:
        flags, libs, _ = OPTIONAL_FLAGS[k]
        compile_flags += flags
        link_flags += libs
    return compile_flags, link_flags


def _compiler_file(path: str) -> tuple[str, ...]:
    """The compiler as a file: its resolved path, size and modification time (a new or
    upgraded compiler is another file); empty where there is none (nothing remembered)."""
    try:
        info = os.stat(path)
    except OSError:
        return ()
    return (os.path.realpath(path), str(info.st_size), str(info.st_mtime_ns))


def remembered(kind: str, parts: tuple[str, ...], ask: Callable[[], T], valid) -> T:
    """What ``ask`` answers, kept in the library cache as ``<kind>-<key>.json`` (the key
    hashes ``parts`` and kiln-cpp's version) and read back by later processes instead of
    asking again (each answer here runs the compiler). A record that is missing, or holds
    a value ``valid`` refuses, is asked again and rewritten; where the cache is turned off
    or refused, or ``parts`` is empty, every process asks."""
    folder = cache_dirs.private_folder("KILN_CPP_CACHE_DIR", "cpp") if parts else None
    if folder is None:
        return ask()
    record = folder / f"{kind}-{record_key(parts)}.json"
    try:
        value = json.loads(record.read_text())["value"]
        if valid(value):
            return value
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = ask()
    with contextlib.suppress(OSError):  # answered all the same; the next process asks
        _write_atomic(record, json.dumps({"value": value}).encode())
    return value


def record_key(parts: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (*parts, __version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _valid_probe(value: object) -> bool:
    """A probe record selects among known flags, never adds one."""
    return isinstance(value, list) and all(
        isinstance(k, int) and 0 <= k < len(OPTIONAL_FLAGS) for k in value
    )


def _probe(path: str) -> list[int]:
    """The indices of :data:`OPTIONAL_FLAGS` whose probe the compiler builds and links."""
    accepted = []
    with tempfile.TemporaryDirectory(prefix="kiln-cpp-probe") as folder:
        for k, (flags, libs, probe) in enumerate(OPTIONAL_FLAGS):
            src, lib = Path(folder) / f"probe{k}.cpp", Path(folder) / f"probe{k}.so"
            src.write_text(probe)
            command = [path, *CXX_FLAGS, *flags, str(src), "-o", str(lib), *libs]
            try:
                subprocess.run(command, capture_output=True, check=True)
            except (OSError, subprocess.CalledProcessError):
                continue
            accepted.append(k)
    return accepted


def cache_key(
    source: str | Sequence[str],
    cxx: str,
    host: str | None = None,
    host_flags: Sequence[str] = HOST_FLAGS,
) -> str:
    """The entry of a library of ``source`` (one translation unit, or several linked) and
    the ``host`` program's unit (built with ``host_flags``)."""
    units = [source] if isinstance(source, str) else list(source)
    h = hashlib.sha256()
    extra_flags, extra_libs = optional_flags(cxx)
    parts = (*units, " ".join(CXX_FLAGS), _compiler_version(cxx), cpu_features(cxx))
    parts += (" ".join(extra_flags + extra_libs),)
    if len(units) > 1 or host is not None:  # the object and link steps' flags too
        parts += (" ".join(OBJECT_FLAGS), " ".join(LINK_FLAGS))
    if host is not None:
        parts += ("host", host, " ".join(host_flags))
    for part in parts:
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


_key_locks: dict[str, threading.Lock] = {}
_key_locks_guard = threading.Lock()


@contextmanager
def _locked(folder: Path, key: str) -> Iterator[None]:
    """Hold the build lock of ``key``: a thread lock, then a file lock for other processes."""
    with _key_locks_guard:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:
        if fcntl is None:
            yield
            return
        entry = folder / key
        entry.mkdir(mode=0o700, exist_ok=True)
        with open(entry / "build.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def build(
    source: str | Sequence[str],
    host: str | None = None,
    host_flags: Sequence[str] = HOST_FLAGS,
) -> tuple[Path, bool]:
    """The shared library of ``source`` (one translation unit, or a list of units) and the
    ``host`` program's unit (compiled with ``host_flags``: :data:`HOST_FLAGS`, or
    :data:`LAUNCH_HOST_FLAGS` for a program that only launches GPU kernels): several units
    are compiled at once and linked. ``(path, built)`` where ``built`` is False for a
    cache hit. Raises :class:`CppCompileError` when the compiler is missing or fails."""
    cxx = compiler()
    key = cache_key(source, cxx, host, host_flags)
    folder = cache_dir()
    entry = folder / key
    lib = cached_library(entry)
    if lib is not None:
        return lib, False
    with _locked(folder, key):
        lib = cached_library(entry)  # built while this waited for the lock
        if lib is not None:
            return lib, False
        _compile(cxx, source, host, host_flags, entry)
    return entry / LIBRARY, True


def lookup(
    source: str | Sequence[str],
    host: str | None = None,
    host_flags: Sequence[str] = HOST_FLAGS,
) -> Path | None:
    """The library :func:`build` would return where the cache holds it, else None (nothing
    is built)."""
    return cached_library(cache_dir() / cache_key(source, compiler(), host, host_flags))


def _compile(
    cxx: str,
    source: str | Sequence[str],
    host: str | None,
    host_flags: Sequence[str],
    entry: Path,
) -> None:
    entry.mkdir(mode=0o700, exist_ok=True)
    units = [source] if isinstance(source, str) else list(source)
    extra_flags, extra_libs = optional_flags(cxx)
    fd, tmp = tempfile.mkstemp(dir=entry, prefix=LIBRARY + ".tmp", suffix=".so")
    os.close(fd)
    try:
        if len(units) == 1 and host is None:
            (entry / "kernels.cpp").write_text(units[0])
            _run(
                [
                    [
                        cxx,
                        *CXX_FLAGS,
                        *extra_flags,
                        str(entry / "kernels.cpp"),
                        "-o",
                        tmp,
                        *extra_libs,
                    ]
                ]
            )
        else:
            named = [(f"kernels{k}", unit, OBJECT_FLAGS) for k, unit in enumerate(units)]
            named += [("host", host, host_flags)] if host is not None else []
            commands, objects = [], []
            for name, text, flags in named:
                (entry / f"{name}.cpp").write_text(text)
                objects.append(str(entry / f"{name}.o"))
                commands.append(
                    [cxx, *flags, *extra_flags, str(entry / f"{name}.cpp"), "-o", objects[-1]]
                )
            try:
                _run(commands)
                _run([[cxx, *LINK_FLAGS, *objects, "-o", tmp, *extra_libs]])
            finally:
                for obj in objects:
                    if os.path.exists(obj):
                        os.unlink(obj)
        os.replace(tmp, entry / LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _write_atomic(entry / (LIBRARY + ".sha256"), _sha256(entry / LIBRARY).encode())


def _run(commands: list[list[str]]) -> None:
    """Run the compiler commands at once (each a process) and wait for all of them."""
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in commands
    ]
    failed = []
    for cmd, proc in zip(commands, procs, strict=True):
        _, stderr = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{stderr[-4000:]}")
    if failed:
        raise CppCompileError("\n".join(failed))


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(BUILD_THREADS, thread_name_prefix="kiln-cpp")


def build_async(
    source: str | Sequence[str],
    host: str | None = None,
    host_flags: Sequence[str] = HOST_FLAGS,
) -> concurrent.futures.Future:
    """:func:`build` on a shared pool of threads: a future of ``(path, built)`` (built
    under the caller's cache root, see :func:`kiln_cpp.cache_dirs.cache_root`)."""
    return _pool().submit(contextvars.copy_context().run, build, source, host, host_flags)


def load(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
