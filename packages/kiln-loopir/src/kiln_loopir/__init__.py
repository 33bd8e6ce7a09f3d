"""Loop IR, fusing scheduler, memory planning and host-program generation.

kiln-loopir lowers a functional aten graph to a small define-by-run loop IR with sympy
indexing, fuses and orders it into kernels, plans memory and generates the host program
(readable Python) that allocates buffers and launches kernels. Code generators for each
device implement its codegen protocol and register in the ``kiln.codegen`` entry-point
group.

This release holds the package's metadata only: the API arrives in 0.1.
"""

from kiln_loopir.__about__ import __version__

__all__ = ["__version__"]
