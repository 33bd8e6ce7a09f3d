"""Triton kernel generation for GPUs.

kiln-triton renders the fused kernels of a kiln-loopir schedule as Triton kernels:
pointwise kernels on 1-D or 2-D blocks, reductions as persistent (whole rows in registers)
or looped kernels chosen by size at launch. Launch configurations are timed on the GPU and
the winners cached on disk. Kernels compile in worker processes (:func:`start_compile_workers`
starts them ahead); a graph's native host program builds in the background while the
Python one runs its first calls (:func:`wait_for_host_builds`). It registers
:data:`triton_codegen` in the ``kiln.codegen`` entry-point group under the name ``triton``.

Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors through Triton's interpreter
(slow; for tests).
"""

from kiln_triton.__about__ import __version__
from kiln_triton.codegen import TritonCodegen, kernel_counts
from kiln_triton.compile_pool import start_compile_workers
from kiln_triton.errors import TritonCodegenError, TritonError
from kiln_triton.host_builds import wait_for_host_builds

# the object the ``kiln.codegen`` entry point ``triton`` resolves to
triton_codegen = TritonCodegen()

__all__ = [
    "TritonCodegen",
    "TritonCodegenError",
    "TritonError",
    "__version__",
    "kernel_counts",
    "start_compile_workers",
    "triton_codegen",
    "wait_for_host_builds",
]
