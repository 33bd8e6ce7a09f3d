"""Compiled binaries found again without computing Triton's cache key, kept in Kiln's cache.

``triton.compile`` keys a kernel by a hash of its source, its options, the environment and
Triton's installation; the installation's part hashes Triton's own files, its 500 MB
``libtriton`` among them, once per process: 0.37 s on the 2-core development machine, the
largest part of loading a graph's few dozen compiled kernels in a warm process.

:func:`remember` writes, after a compile, the cache key Triton gave a job (a
:func:`kiln_triton.precompiled.compile_job`) under a key of Kiln's own (:func:`entry`):
the job; for a kernel module's function, the module's name (its source's hash), the
function's name and the digest of ``device.py`` (any other function: its ``cache_key``,
which walks its syntax tree and its callees'); Triton's version and location, the size
and modification time of each file Triton hashes for its installation's part and of its
backends' compiler binaries, and the environment variables Triton keys by (with every
``TRITON_*`` one). It also keeps a copy of what loading and launching the binary read (its
metadata, the binary, its PTX) beside that entry, so that Kiln's cache alone holds a warm
start's binaries (and clearing it clears them).
:func:`recall` finds the binary again under that key: from the kept copy, else as
``triton.compile`` itself finds a cached one (the metadata group of its file name in the
cache folder of its key); None where nothing is remembered, the files are gone, or Triton
is set to compile, dump or override kernels (``TRITON_ALWAYS_COMPILE`` ...).
The entries and the kept binaries live in kiln-triton's cache (``<cache>/binaries/``).

Kernels compiled at a launch (symbolic sizes, calls with misaligned tensors) still need
Triton's key.
:func:`compute_key_in_background` starts computing it in a thread, once per process
(``TritonCodegen.prepare``, which ``kiln.compile()`` calls on a machine with CUDA), so
that it overlaps the capture of the first call (reading and hashing the files release the
interpreter's lock).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

_key_thread: threading.Thread | None = None
KERNEL_MODULE_PREFIX = "kiln_triton_kernel_"  # a kernel module's name, then its source's hash
# a binary's intermediate forms, which launching it never reads: not loaded by _found
_INTERMEDIATE = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn")


def folder() -> Path:
    """Where the keys are remembered: ``binaries/`` in kiln-triton's cache."""
    from kiln_triton import autotune

    return autotune.cache_dir() / "binaries"


def entry(source, job: dict) -> Path | None:
    """Where the key of ``job``'s binary (compiled from ``source``, an ``ASTSource``) is
    remembered; None where Triton is set to compile anyway. A job that names its
    ``binaries_dir`` (:func:`kiln_triton.precompiled.compile_job`'s do) is remembered
    there: a compile worker then never imports what the cache's folder is worked out from
    (torch, which takes seconds to import in a fresh process). Whether the worker builds
    Triton's launcher too (``launcher``) is no part of the binary's key."""
    if _compiling_anyway():
        return None
    described = {k: v for k, v in job.items() if k not in ("attrs", "binaries_dir", "launcher")}
    described["attrs"] = sorted([list(k), v] for k, v in job["attrs"].items())
    text = json.dumps(
        [described, _source_key(source.fn), _installation_digest(), _environment()],
        sort_keys=True,
    )
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    where = job.get("binaries_dir")
    return (Path(where) if where else folder()) / f"{key}.json"


def _source_key(fn) -> str:
    """What ``fn``'s compile depends on of Python source. For a function of a Kiln kernel
    module: the module's name (its source's hash), the function's name and the digest of
    the device functions it may call (``kt.*``, kiln-triton's ``device.py``), everything
    Triton's ``cache_key`` reads of it; that key walks the function's syntax tree and the
    functions it calls, milliseconds a kernel, most of loading a warm graph's binaries.
    Any other function: Triton's ``cache_key``."""
    module = fn.fn.__module__
    device = fn.fn.__globals__.get("kt")
    if not module.startswith(KERNEL_MODULE_PREFIX) or device is None:
        return fn.cache_key
    return f"{module}.{fn.fn.__name__} {_file_digest(device.__file__)}"


@functools.cache
def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@functools.cache
def _installation_digest() -> str:
    return hashlib.sha256(json.dumps(_installation()).encode()).hexdigest()


def recall(source, path: Path | None):
    """The ``CompiledKernel`` compiled from ``source`` under the key remembered at
    ``path`` (its :func:`entry`): from the files kept beside it, else from Triton's cache
    (whose files are then kept too); None where neither has it."""
    known = _read(path)
    return None if known is None else _found(source, known["hash"], path)


def _read(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return known if isinstance(known, dict) and "hash" in known else None


def _found(source, key: str, entry: Path):
    """The ``CompiledKernel`` of ``source`` under Triton's key ``key``: from the files
    kept beside its ``entry`` (:func:`_keep`), else from Triton's cache folder of ``key``
    (and those files kept then), or None."""
    from triton.compiler import CompiledKernel
    from triton.runtime.cache import get_cache_manager

    file_name = f"{source.name[:150]}.json"  # as triton.compile names the metadata
    group = _kept_files(entry.parent / key, file_name)
    from_triton = group is None
    if from_triton:
        group = get_cache_manager(key).get_group(file_name)
        if not group or file_name not in group:
            return None
    # the metadata and the binary alone are read (an intermediate form, PTX say, is read
    # from its file where it is asked for: kiln_triton.compiled_launch.ptx_params)
    needed = {name: path for name, path in group.items() if not name.endswith(_INTERMEDIATE)}
    compiled = CompiledKernel(source, needed, key)
    compiled.metadata_group = group
    if from_triton:
        _keep(entry, compiled)
    return compiled


def _kept_files(folder: Path, file_name: str) -> dict[str, str] | None:
    """The files kept in ``folder`` by name, where it holds the metadata ``file_name``."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    return {n: str(folder / n) for n in names} if file_name in names else None


def _keep(entry: Path | None, compiled) -> None:
    """Copy what loading and launching ``compiled`` read of it (its metadata, its binary
    and its PTX) from Triton's cache into Kiln's, beside ``entry``: ``<hash>/`` in the
    entries' folder. A warm start then loads it from Kiln's cache alone, and clearing
    Kiln's cache clears it (Triton's cache keeps its own copy, with the other forms)."""
    group = getattr(compiled, "metadata_group", None)
    if entry is None or not group:
        return
    kept = entry.parent / compiled.hash
    if kept.is_dir():
        return
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-")
        for name, source in group.items():
            if not name.endswith(_INTERMEDIATE) or name.endswith(".ptx"):
                shutil.copyfile(source, os.path.join(tmp, name))
        os.replace(tmp, kept)
    except OSError:  # a read-only cache, or another process kept it first
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def remember(path: Path | None, compiled) -> None:
    """Write at ``path`` (an :func:`entry`) the key Triton's cache holds ``compiled``
    under, and keep its files beside it (:func:`_keep`)."""
    _write(path, {"hash": compiled.hash})
    _keep(path, compiled)


def _write(path: Path | None, known: dict) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(known, f)
        os.replace(tmp, path)
    except OSError:  # a read-only cache costs the next process Triton's key, nothing more
        pass


@functools.cache
def _installation() -> list:
    """What Triton's cache key reads of its installation (its files, and the compiler
    binaries its backends run, whose versions it keys by), as file sizes and times."""
    import triton

    root = Path(triton.__file__).parent
    files = [*root.glob("_C/libtriton*"), *root.glob("runtime/cache.py")]
    files += root.glob("backends/*/bin/*")
    for folder in ("compiler", "backends", "language"):
        files += root.glob(f"{folder}/**/*.py")
    stats = sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in files)  # fmt: skip
    return [triton.__version__, str(root), stats]


def _environment() -> list:
    """The environment variables Triton keys by, and every ``TRITON_*`` one (a compiler
    binary named by a variable, say): more than Triton reads, never less."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    named = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    return sorted({**named, **get_cache_invalidating_env_vars()}.items())


def _compiling_anyway() -> bool:
    """Whether Triton is set to compile (or dump, or override) kernels its cache holds."""
    from triton import knobs

    compilation = knobs.compilation
    return any(
        getattr(compilation, flag, False) for flag in ("always_compile", "override", "dump_ir")
    )


def compute_key_in_background() -> None:
    """Start computing Triton's cache key of its installation in a thread (once)."""
    global _key_thread
    if _key_thread is None:
        _key_thread = threading.Thread(target=_triton_key, name="kiln-triton-key", daemon=True)
        _key_thread.start()


def _triton_key() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()  # kept by Triton (functools.lru_cache) for its compiles
    except Exception:  # noqa: BLE001 - another Triton: its first compile computes its key
        return
