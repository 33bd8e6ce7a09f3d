"""CUDA-graph runtime.

kiln-cudagraphs captures a compiled host program once per input shape into a CUDA graph
with static input and output buffers in shared memory pools, then replays it. It
registers itself in the ``kiln.runtime`` entry-point group under the name
``cudagraphs``.

This release holds the package's metadata only: the runtime arrives in 0.1.
"""

from kiln_cudagraphs.__about__ import __version__

__all__ = ["__version__"]
