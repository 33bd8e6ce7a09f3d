"""A kernel module's variants, imported cheaply and made ``triton.jit`` functions at first use.

A rendered kernel module holds one function per variant (a reduction's persistent, looped
and split ones ...), each marked ``@kt.jit_later``: importing the module makes no
``JITFunction`` (whose constructor reads and tokenizes the function's source, about a
millisecond each), and :func:`jit_function` makes one for the variants a launch or a
compile asks for, once. A warm start imports a model's few hundred kernel modules and uses
one variant of most.

:func:`load_kernel_module` imports a kernel module from its file in the cache: the code
object, compiled once, is kept beside it (``k<hash>.code``, ``marshal``'s form, whatever
``PYTHONDONTWRITEBYTECODE`` says), and the source goes to ``linecache`` so that Triton
reads it from memory. The module imports nothing but Triton and :mod:`kiln_triton.device`:
the compile workers use it without torch.
"""

from __future__ import annotations

import linecache
import marshal
import os
import sys
import types
from pathlib import Path

import triton

CODE_SUFFIX = ".code"
# whether Triton compiles a kernel whose sizes are arguments for what it sees of them
# (each size and block count 1 or not, a multiple of 16 or not): one compiled kernel per
# such specialization met, and a new size of a new specialization compiles one more. The
# default (as torch.compile does for symbolic sizes) compiles them for any value: one
# kernel per configuration runs every size (only whether each fits 32 bits is compiled
# in), and block counts whose specialization is the same at every size (``64*s0``) stay
# specialized (see :func:`unspecialized`). KILN_TRITON_SPECIALIZE_SIZES=1 specializes all
SPECIALIZE_SIZES = os.environ.get("KILN_TRITON_SPECIALIZE_SIZES", "0") == "1"


def jit_function(module: types.ModuleType, name: str):
    """``module.<name>`` as a ``triton.jit`` function, made at the first call and kept."""
    fn = getattr(module, name)
    if getattr(fn, "__kiln_jit_later__", False):
        fn = triton.jit(fn, do_not_specialize=unspecialized(module, fn))
        setattr(module, name, fn)
    return fn


def unspecialized(module: types.ModuleType, fn) -> list[str]:
    """The parameters of ``fn`` that Triton compiles for any value where
    :data:`SPECIALIZE_SIZES` is off: its sizes, and its block counts but those whose
    specialization is the same at every size (``META['fixed_specialization']``: a number,
    or a multiple of 16 at every size, which Triton's compile may then assume: a kernel
    compiled for one size still runs every other). None where the sizes are numbers."""
    meta = getattr(module, "META", {})
    if SPECIALIZE_SIZES or not meta.get("sizes"):
        return []
    fixed = set(meta.get("fixed_specialization", ()))
    sizes = {*meta["sizes"], *(n for n in meta["numels"] if n not in fixed)}
    return [p for p in fn.__code__.co_varnames[: fn.__code__.co_argcount] if p in sizes]


def load_kernel_module(path: Path, name: str, source: str | None = None) -> types.ModuleType:
    """The kernel module at ``path`` (its ``source``, where the caller has it), imported as
    ``name``."""
    if source is None:
        source = path.read_text()
    info = path.stat()
    linecache.cache[str(path)] = (info.st_size, info.st_mtime, source.splitlines(True), str(path))
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(_code(path, source, info), module.__dict__)  # noqa: S102 - Kiln's own kernel
    return module


def _code(path: Path, source: str, info: os.stat_result) -> types.CodeType:
    """The module's code: read from its ``.code`` file where that was written for this
    source file (its size and modification time), else compiled and written."""
    kept = path.with_suffix(CODE_SUFFIX)
    stamp = f"{sys.version} {info.st_size} {info.st_mtime_ns}\n".encode()
    try:
        data = kept.read_bytes()
        if data.startswith(stamp):
            return marshal.loads(data[len(stamp) :])
    except (OSError, ValueError, EOFError):
        pass
    code = compile(source, str(path), "exec")
    try:
        tmp = kept.with_suffix(f"{CODE_SUFFIX}.{os.getpid()}")
        tmp.write_bytes(stamp + marshal.dumps(code))
        tmp.replace(kept)
    except OSError:  # a read-only cache costs a compile per process, nothing else
        pass
    return code
