"""A compile worker: a Python process that compiles Triton kernels for an explicit GPU target
and never touches CUDA (see :mod:`kiln_triton.compile_pool`, which starts it).

It runs as a script (``python -P compile_worker.py``): the kernels need only ``triton`` and
:mod:`kiln_triton.device` (the call that compiles them, :mod:`kiln_triton.precompiled`),
so the package is registered without running its ``__init__``
(which imports torch and kiln-loopir) and the worker is ready in a fraction of a second.

Protocol: pickled jobs on stdin, one pickled reply each on the original stdout (what the
compiler prints goes to stderr). A job names a kernel module by path and one of its
``@triton.jit`` functions, and gives ``triton.compile``'s arguments; the compiled kernel
lands in Triton's on-disk cache, where the parent's identical call finds it. The worker
exits when stdin closes.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
import types

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
WARM_UP_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def warm_up(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)
"""


def _register_package() -> None:
    """``kiln_triton`` importable for its submodules (``device``) without its ``__init__``."""
    package = types.ModuleType("kiln_triton")
    package.__path__ = [PACKAGE_DIR]
    sys.modules["kiln_triton"] = package


def _load_module(path: str, name: str, modules: dict):
    """The kernel module at ``path``, imported once under the parent's module name (a
    module of kiln-triton's own, such as its attention kernels', imported as usual)."""
    from pathlib import Path

    from kiln_triton.variants import load_kernel_module

    if path not in modules:
        if name.startswith("kiln_triton."):
            modules[path] = importlib.import_module(name)
        else:
            modules[path] = load_kernel_module(Path(path), name)
    return modules[path]


def compile_job(job: dict, modules: dict) -> dict:
    """Compile one job; the reply names the compiled kernel's cache hash, or the error, and
    the seconds it took (``launcher``: of them, building Triton's launcher)."""
    from kiln_triton import precompiled

    started = time.perf_counter()
    try:
        os.environ["TRITON_CACHE_DIR"] = job["cache_dir"]  # the parent's Triton cache
        from kiln_triton.variants import jit_function

        fn = jit_function(_load_module(job["path"], job["module"], modules), job["function"])
        kernel = precompiled.load(fn, job)  # the parent's call: the same cache key
        compiled = time.perf_counter()
        if job.get("launcher", True):  # the first job of its signature (see codegen)
            _build_launcher(kernel)
        reply = {"hash": kernel.hash, "error": None, "launcher": time.perf_counter() - compiled}
    except Exception as exc:  # noqa: BLE001 - the parent reports it and compiles itself
        last = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
        reply = {"hash": None, "error": f"{type(exc).__name__}: {exc}{where}"}
    reply.update(pid=os.getpid(), seconds=time.perf_counter() - started)
    return reply


def _build_launcher(kernel) -> None:
    """Where Triton compiles a C launcher per kernel signature (3.6 does, with gcc, at a
    kernel's first launch in the parent, one after the other), build it here: it lands in
    Triton's cache, where the parent's launch finds it. Any failure (no CUDA driver library
    on this machine, a Triton whose launcher is generic) leaves it to the parent."""
    try:
        from triton.backends.nvidia import driver as nvidia

        if hasattr(nvidia, "make_launcher"):
            nvidia.CudaLauncher(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001, S110 - the parent builds it at the first launch
        pass


def warm_up() -> None:
    """Compile a tiny kernel into a throw-away cache, so that Triton's one-time costs (its
    backend, LLVM, ptxas's version: ~0.4 s) are paid before the first job, not in it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with tempfile.TemporaryDirectory(prefix="kiln-triton-warm-up-") as folder:
        path = os.path.join(folder, "warm_up.py")
        with open(path, "w") as f:
            f.write(WARM_UP_KERNEL)
        os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "cache")
        fn = _load_module(path, "kiln_triton_warm_up", {}).warm_up
        signature = {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
        source = ASTSource(fn, signature, {"BLOCK": 16})
        triton.compile(source, target=GPUTarget("cuda", 80, 32))  # any target warms it


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; stdin's EOF ends it
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints of the compiler (and of kernels' modules) go to stderr
    os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, never the interpreter's
    _register_package()
    import triton.compiler  # noqa: F401 - imported before the first job arrives

    import kiln_triton.device  # noqa: F401
    import kiln_triton.precompiled  # noqa: F401

    try:
        warm_up()
    except Exception as exc:  # noqa: BLE001 - the jobs pay for it instead
        print(f"kiln-triton compile worker: warming up failed: {exc}", file=sys.stderr)
    pickle.dump({"ready": os.getpid()}, replies)
    replies.flush()
    requests = sys.stdin.buffer
    modules: dict = {}
    while True:
        try:
            job = pickle.load(requests)
        except EOFError:
            return
        pickle.dump(compile_job(job, modules), replies)
        replies.flush()


if __name__ == "__main__":
    main()
