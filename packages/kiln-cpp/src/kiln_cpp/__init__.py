"""C++/OpenMP kernel generation for CPUs.

kiln-cpp renders the fused kernels of a kiln-loopir schedule as C++ with OpenMP, builds
them with the system C++ compiler into one shared library per graph, caches the libraries
on disk and loads them. It registers itself in the ``kiln.codegen`` entry-point group
under the name ``cpp``.

This release holds the package's metadata only: code generation arrives in 0.1.
"""

from kiln_cpp.__about__ import __version__

__all__ = ["__version__"]
