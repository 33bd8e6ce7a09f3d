"""C++/OpenMP kernel generation for CPUs.

kiln-cpp renders the fused kernels of a kiln-loopir schedule as C++ with OpenMP, builds
them with the system C++ compiler into one shared library per graph, caches the libraries
on disk and loads them. It registers :class:`CppCodegen` in the ``kiln.codegen``
entry-point group under the name ``cpp``.

The libraries are cached in ``$KILN_CPP_CACHE_DIR``, else ``<root>/cpp`` where the root is
the one :func:`cache_root` sets, else ``$KILN_CACHE_DIR``, else ``~/.cache/kiln`` (see
:mod:`kiln_cpp.cache_dirs`); folders are private to the user.

Errors derive from :class:`CppError`: :class:`CppCodegenError` for a kernel the generator
cannot render yet, :class:`CppCompileError` for a missing or failing compiler. A caller
catching ``CppError`` can run the graph eagerly instead.
"""

from kiln_cpp.__about__ import __version__
from kiln_cpp.cache_dirs import cache_root
from kiln_cpp.codegen import CppCodegen, kernel_counts
from kiln_cpp.errors import CppCodegenError, CppCompileError, CppError

# the object the ``kiln.codegen`` entry point ``cpp`` resolves to
cpp_codegen = CppCodegen()

__all__ = [
    "CppCodegen",
    "CppCodegenError",
    "CppCompileError",
    "CppError",
    "__version__",
    "cache_root",
    "cpp_codegen",
    "kernel_counts",
]
