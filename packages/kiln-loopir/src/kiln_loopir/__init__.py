"""Loop IR, fusing scheduler, memory planning and host-program generation.

kiln-loopir lowers a functional aten graph to a small define-by-run loop IR with sympy
indexing (:func:`lower`), groups and fuses its nodes into kernels in an order that keeps
live memory low (:func:`schedule_graph`), plans memory with buffer reuse and in-place
writes (:func:`plan_memory`) and generates the host program (readable Python) that
allocates buffers and launches kernels (:func:`generate_host`). :func:`compile_fx` runs
the whole pipeline. Code generators for each device implement :class:`Codegen` and
register in the ``kiln.codegen`` entry-point group; the built-in ``"reference"`` codegen
runs kernels as vectorised torch Python to check the IR.
"""

from kiln_loopir.__about__ import __version__
from kiln_loopir.codegen import Codegen, resolve_codegen
from kiln_loopir.compile import (
    CompiledGraph,
    CompiledKernel,
    HostProgram,
    compile_fx,
    load_host_program,
    schedule_graph,
)
from kiln_loopir.convolution_relu import CONVOLUTION_RELU, convolution_relu
from kiln_loopir.dce import eliminate_dead_nodes
from kiln_loopir.decompose import decompose
from kiln_loopir.greedy_fusion import fuse
from kiln_loopir.grouped_attention import GROUPED_ATTENTION, grouped_attention
from kiln_loopir.host import generate_host, kernel_launch_args
from kiln_loopir.ir import (
    Buffer,
    ComputedNode,
    ExternNode,
    IRError,
    LoopGraph,
    Pointwise,
    Reduction,
    Scatter,
    TensorRef,
)
from kiln_loopir.kernel import Kernel, Schedule
from kiln_loopir.lowering import lower, lowered_ops, register_lowering
from kiln_loopir.memory import MemoryPlan, plan_memory
from kiln_loopir.ops import TraceHandler
from kiln_loopir.reference import ReferenceCodegen
from kiln_loopir.scheduler import order, unfused_schedule

__all__ = [
    "Buffer",
    "CONVOLUTION_RELU",
    "Codegen",
    "CompiledGraph",
    "CompiledKernel",
    "ComputedNode",
    "ExternNode",
    "GROUPED_ATTENTION",
    "HostProgram",
    "IRError",
    "Kernel",
    "LoopGraph",
    "MemoryPlan",
    "Pointwise",
    "Reduction",
    "ReferenceCodegen",
    "Scatter",
    "Schedule",
    "TensorRef",
    "TraceHandler",
    "__version__",
    "compile_fx",
    "convolution_relu",
    "decompose",
    "eliminate_dead_nodes",
    "fuse",
    "generate_host",
    "grouped_attention",
    "kernel_launch_args",
    "load_host_program",
    "lower",
    "lowered_ops",
    "order",
    "plan_memory",
    "register_lowering",
    "resolve_codegen",
    "schedule_graph",
    "unfused_schedule",
]
