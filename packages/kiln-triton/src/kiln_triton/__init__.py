"""Triton kernel generation for GPUs.

kiln-triton renders the fused kernels of a kiln-loopir schedule as Triton kernels,
autotunes their launch configurations and caches the winners. It registers itself in the
``kiln.codegen`` entry-point group under the name ``triton``.

This release holds the package's metadata only: code generation arrives in 0.1.
"""

from kiln_triton.__about__ import __version__

__all__ = ["__version__"]
