"""The attention kernels of Kiln's that a native host program launches in place of ATen's
attention ops, launched by the graph's Python host program too.

The Python host program runs a graph's first calls while its native program builds
(:mod:`kiln_triton.host_builds`), and any call the native program hands back. Calling
ATen's op there would run another kernel than every later call: with other rounding, and
at a cost only a first call pays (cuDNN plans its fused attention for each new layout at
its first call: 0.54 s for BERT's forward and 0.86 s for its backward on an H200, about a
tenth of a cold training step).

:class:`KernelLaunch` takes the op's arguments and returns what the op returns: its
results allocated in the layouts the graph planned, as the native program allocates them,
the kernel writing those something reads. It launches the compiled kernel with the launch
the native program plans (grid, block, shared memory, parameters), through the CUDA
driver's ``cuLaunchKernel`` on the current stream. A call whose operands are not 16-byte
aligned (the kernel is compiled to assume they are) runs the op.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from kiln_loopir.ir import ExternNode, TensorRef
from kiln_triton.attention import ALIGNMENT

C_VALUES = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint32_t": ctypes.c_uint32}
C_VALUES |= {"uint64_t": ctypes.c_uint64, "float": ctypes.c_float, "double": ctypes.c_double}


@functools.cache
def _cu_launch_kernel() -> Callable[..., int]:
    driver = ctypes.CDLL("libcuda.so.1")
    launch = driver.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    launch.restype = ctypes.c_int
    return launch


def _launch_failed(status: int) -> str:
    text = ctypes.c_char_p()
    ctypes.CDLL("libcuda.so.1").cuGetErrorString(status, ctypes.byref(text))
    return (text.value or b"").decode() or f"CUDA error {status}"


class KernelLaunch:
    """``node``'s op computed by a compiled kernel of Kiln's: ``function`` (its handle)
    launched on ``grid`` with ``block`` threads, ``shared`` bytes of shared memory and
    ``params`` ((C type, value) in the kernel's order; a pointer's value is the
    :class:`TensorRef` it points at, or None)."""

    def __init__(self, node: ExternNode, function: int, grid, block: int, shared: int, params):
        self.op = node.target
        self.function, self.grid, self.block, self.shared = function, tuple(grid), block, shared
        self.sources = [_source(node, ctype, value) for ctype, value in params]
        self.inputs = [where for kind, where in self.sources if kind == "input"]
        # (size, stride, dtype, device) of each result, allocated as the native program
        # allocates them: those the kernel does not write are read by nothing that uses them
        # (a random generator's seed and offset, which no dropout uses)
        self.outputs = [None if b is None else _layout(b) for b in node.outputs]
        self.device = next(o[3] for o in self.outputs if o is not None)
        self.bare = len(node.outputs) == 1 and not node.tuple_output  # one tensor, no tuple

    def __call__(self, *args: object, **kwargs: object) -> tuple:
        if any(args[i].data_ptr() % ALIGNMENT for i in self.inputs):
            return self.op(*args, **kwargs)
        results = [None if o is None else torch.empty_strided(o[0], o[1], dtype=o[2], device=o[3])
                   for o in self.outputs]  # fmt: skip
        values = []
        for kind, where in self.sources:
            if kind == "input":
                values.append(ctypes.c_void_p(args[where].data_ptr()))
            elif kind == "output":
                values.append(ctypes.c_void_p(results[where].data_ptr()))
            else:
                values.append(where)  # a number, or a null pointer, as its C type
        if 0 in self.grid:  # nothing to compute at these sizes
            return results[0] if self.bare else tuple(results)
        params = (ctypes.c_void_p * max(1, len(values)))(*map(ctypes.addressof, values))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        status = _cu_launch_kernel()(
            self.function, *self.grid, self.block, 1, 1, self.shared, stream, params, None
        )
        if status:
            failed = _launch_failed(status)
            raise RuntimeError(f"{self.op}: launching Kiln's kernel failed: {failed}")
        return results[0] if self.bare else tuple(results)


def _source(node: ExternNode, ctype: str, value: object) -> tuple[str, object]:
    """Where a launch parameter comes from: ("input", position of the op's argument),
    ("output", index of its result), or ("value", the C value)."""
    if ctype != "void*":
        number = float(value) if ctype in ("float", "double") else int(value)
        return "value", C_VALUES[ctype](number)
    if value is None:
        return "value", ctypes.c_void_p(None)
    for i, arg in enumerate(node.args):
        if arg is value:
            return "input", i
    for j, result in enumerate(node.outputs):
        whole = result is not None and isinstance(value, TensorRef) and value.is_whole(result)
        if whole and value.buffer == result.name:
            return "output", j
    raise ValueError(f"{node.target}: a pointer to {value!r}, neither an argument nor a result")


def _layout(buffer) -> tuple:
    size, stride = tuple(map(int, buffer.size)), tuple(map(int, buffer.stride))
    return size, stride, buffer.dtype, buffer.device
