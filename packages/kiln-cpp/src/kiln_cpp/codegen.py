"""``CppCodegen``: kiln-loopir's codegen protocol for CPUs, as C++ with OpenMP."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from kiln_cpp import build, cache_dirs
from kiln_cpp.host import NativeHost, load_runtime, render_host
from kiln_cpp.library import library_source
from kiln_cpp.prelude import PRELUDE
from kiln_cpp.render import render_group, render_kernel
from kiln_loopir import compile_lock
from kiln_loopir.kernel import Kernel
from kiln_loopir.launch import LaunchGroup

# kernels compiled into a new library, and kernels whose library was found built, in this
# process (see kernel_counts)
_KERNEL_COUNTS = {"built": 0, "reused": 0}


def kernel_counts() -> dict[str, int]:
    """``{"built": n, "reused": m}``: kernel bodies this process compiled, and kernels it
    did not compile: found in libraries already built (the on-disk cache, or an earlier
    graph), or the same as another kernel of their library (compiled once for all their
    names, see :mod:`kiln_cpp.library`)."""
    return dict(_KERNEL_COUNTS)


class CppKernel:
    """A compiled kernel: call it as the host program does, ``kernel(*tensors, *sizes)``.

    The call is a Python function generated for the kernel's signature (tensors passed as
    ``data_ptr()``, sizes as ``int64_t`` through the ctypes ``argtypes``): no loop over
    the arguments, and a device check that costs one attribute read per tensor."""

    def __init__(self, name: str, fn: ctypes._CFuncPtr, pointer_args: list[bool]) -> None:
        self.name = name
        self._fn = fn
        self._pointer_args = pointer_args
        fn.argtypes = [ctypes.c_void_p if p else ctypes.c_int64 for p in pointer_args]
        fn.restype = ctypes.c_int
        self._call = _launcher(name, fn, pointer_args)

    def __call__(self, *args: object) -> None:
        try:
            failed = self._call(*args)
        except (TypeError, AttributeError, ctypes.ArgumentError):
            self._check(args)
            raise
        if failed:
            raise IndexError(f"{self.name}: an index is out of range of the tensor it indexes")

    def _check(self, args: tuple) -> None:
        """Raise the error that explains a call the fast path refused."""
        if len(args) != len(self._pointer_args):
            raise TypeError(
                f"{self.name} takes {len(self._pointer_args)} arguments, got {len(args)}"
            )
        for a, is_ptr in zip(args, self._pointer_args, strict=True):
            if is_ptr and (not isinstance(a, torch.Tensor) or a.device.type != "cpu"):
                raise TypeError(f"{self.name}: expected a CPU tensor, got {a!r}")

    def __repr__(self) -> str:
        return f"CppKernel({self.name})"


def _launcher(name: str, fn: ctypes._CFuncPtr, pointer_args: list[bool]) -> Callable:
    params = [f"a{i}" for i in range(len(pointer_args))]
    tensors = [p for p, is_ptr in zip(params, pointer_args, strict=True) if is_ptr]
    values = [
        f"{p}.data_ptr()" if is_ptr else p for p, is_ptr in zip(params, pointer_args, strict=True)
    ]
    lines = [f"def launch_{name}({', '.join(params)}):"]
    if tensors:
        lines.append(f"    if not ({' and '.join(t + '.is_cpu' for t in tensors)}):")
        lines.append("        raise TypeError('expected CPU tensors')")
    lines.append(f"    return fn({', '.join(values)})")
    namespace: dict = {"fn": fn}
    exec("\n".join(lines), namespace)  # noqa: S102 - the source is built above
    return namespace[f"launch_{name}"]


HOST_HEADER = (
    'extern "C" {\n' + (Path(__file__).parent / "host" / "kiln_host.h").read_text() + "}\n"
)


def load_program(lib: ctypes.CDLL, host: NativeHost):
    """The runtime's ``Program`` over the library's ``kiln_host_init``/``kiln_host_call``."""
    program = pending_program(host)
    start_program(program, lib, host)
    return program


def pending_program(host: NativeHost):
    """The runtime's ``Program`` of ``host`` before its library is built: its calls run
    its fallback (``set_fallback``) until :func:`start_program`."""
    return load_runtime().Program(
        0, 0, host.n_inputs, host.n_outputs, tuple(call.prepared for call in host.externs),
        (), "host program",
    )  # fmt: skip


def start_program(program, lib: ctypes.CDLL, host: NativeHost) -> None:
    """``program`` (and the programs ``bind_last`` made of it) runs ``lib`` from now on."""
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    program.start(address(lib.kiln_host_init), address(lib.kiln_host_call), tuple(host.functions))
    program.library = lib  # kept loaded while the program lives


class CppCodegen:
    """Renders kernels as C++ with OpenMP and builds each graph's kernels into one shared
    library with the system compiler, cached on disk (see :mod:`kiln_cpp.build`).

    ``compile`` raises :class:`kiln_cpp.CppCompileError` when no compiler is found or it
    fails; ``render`` raises :class:`kiln_cpp.CppCodegenError` for what it cannot render.
    ``builds`` and ``cache_hits`` count the libraries this object built and found cached.
    """

    name = "cpp"
    # adjacent reduction loops that every access walks as one run come as one loop
    # (kiln_loopir.loops): a batch norm's H and W, vectorised as H*W points
    merges_reduction_loops = True
    device_types = ("cpu",)
    renders_scans = True  # cumulative ops: a loop walked in order (render.py)
    # g++ vectorises no read under a mask at a step (a max pooling's taps over its padding):
    # kiln-loopir writes such a producer once instead of inlining it
    vectorises_masked_strided_reads = False
    # the caller's cache root for a compile (kiln's cache_dir): see kiln_cpp.cache_root
    cache_root = staticmethod(cache_dirs.cache_root)

    def __init__(self) -> None:
        self.builds = 0
        self.cache_hits = 0
        self.last_library = None

    def render(self, kernel: Kernel) -> str:
        return render_kernel(kernel)

    def render_group(self, group: LaunchGroup) -> str:
        """Consecutive kernels as one function: the host program makes one foreign call."""
        return render_group(group)

    def render_host(self, schedule, plan) -> NativeHost:
        """The graph's host program as C++ (raises :class:`kiln_cpp.host.HostNotRendered`
        for a graph it does not cover, :class:`CppCompileError` when the host runtime
        cannot be built)."""
        return render_host(schedule, plan, load_runtime())

    def load_host(self, data: dict) -> NativeHost:
        """A host program from :meth:`NativeHost.to_dict` (a cache entry), to compile."""
        return NativeHost.from_dict(data, load_runtime())

    def compile(self, sources: Sequence[str], host: NativeHost | None = None) -> list[Callable]:
        """One callable per source; with ``host``, the loaded host program after them,
        built into the same library (each distinct kernel compiled once, a big library
        in parallel: see :mod:`kiln_cpp.library`)."""
        if not sources and host is None:
            return []
        host_source = None if host is None else "\n" + HOST_HEADER + host.source
        library = library_source(PRELUDE, sources, host_source)
        with compile_lock.waiting():  # another graph's compile may work meanwhile
            path, built = build.build(library.units, library.host)
        self.builds += built
        self.cache_hits += not built
        _KERNEL_COUNTS["built"] += library.distinct if built else 0
        _KERNEL_COUNTS["reused"] += len(sources) - library.distinct if built else len(sources)
        self.last_library = path
        lib = build.load(path)
        kernels = []
        for fn in library.functions:
            pointers = ["*" in t for t, _ in fn.params]
            kernels.append(CppKernel(fn.name, getattr(lib, fn.name), pointers))
        if host is not None:
            kernels.append(load_program(lib, host))
        return kernels

    def __repr__(self) -> str:
        return "CppCodegen()"
