"""Kiln: a compiler for PyTorch programs.

``kiln.compile(model)`` captures the Python program as graphs (kiln-capture), splits
training graphs into forward and backward aten graphs (kiln-autograd), lowers them to a
loop IR that is fused and scheduled (kiln-loopir), generates kernels for the device
(kiln-cpp, kiln-triton: the ``kiln.codegen`` entry points) and runs them, optionally
through a runtime plug-in (kiln-cudagraphs: ``kiln.runtime``).

    >>> compiled = kiln.compile(model)          # or @kiln.compile on a function
    >>> kiln.explain(model)(x)                  # graphs, graph breaks, guards
    >>> kiln.mark_dynamic(x, 0, min=2, max=64)  # x's dim 0 symbolic from the first call
    >>> kiln.list_backends()                    # installed plug-ins, and why any failed
    >>> kiln.set_logs("graph,perf")             # or KILN_LOGS=graph,perf; KILN_DEBUG=<dir>
    >>> kiln.cache_info(); kiln.clear_cache()   # or python -m kiln cache info|clear

Kiln is also a ``torch.compile`` backend: ``torch.compile(model, backend="kiln")``.
"""

from kiln import tensor_guards  # noqa: F401 - registers the native tensor matcher
from kiln.__about__ import __version__
from kiln._plugins import Plugin, list_backends
from kiln.api import compile, disable, explain, reset
from kiln.cache_folders import CacheInfo, CachePart, cache_info, clear_cache
from kiln.config import Options
from kiln.frames import compile_timeline, compile_times
from kiln.logs import configure_from_environment, set_logs
from kiln.module import CompiledFunction, CompiledModule
from kiln_capture import mark_dynamic, mark_static

configure_from_environment()

__all__ = [
    "CacheInfo",
    "CachePart",
    "CompiledFunction",
    "CompiledModule",
    "Options",
    "Plugin",
    "__version__",
    "cache_info",
    "clear_cache",
    "compile",
    "compile_timeline",
    "compile_times",
    "disable",
    "explain",
    "list_backends",
    "mark_dynamic",
    "mark_static",
    "reset",
    "set_logs",
]
