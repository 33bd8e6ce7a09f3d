"""Kiln's attention kernels by the names a native host program's records give them, and
their compilation from a record's plain data."""

from __future__ import annotations

from pathlib import Path

import torch

from kiln_triton import known_binaries
from kiln_triton.attention import attention_fwd, forward_launch
from kiln_triton.attention_backward import attention_bwd, backward_launch

# name -> (kernel, its (warps, pipeline stages) for a head size and dtype)
KERNELS = {
    "attention_fwd": (attention_fwd, forward_launch),
    "attention_bwd": (attention_bwd, backward_launch),
}
# binaries loaded in this process, by known_binaries.jit_entry, device and current device
_loaded: dict[tuple[Path, str, int], object] = {}


def compile_attention(kernel: str, args: dict, grid: list, buffers: dict, device: str):
    """``kernel`` compiled for these arguments (``plain_compile_args`` of
    :mod:`kiln_triton.attention`), on zero-filled buffers of these dtypes and element spans.
    Plain data, so a cache entry can compile it again; a binary compiled for the same data
    before is found in Triton's cache without Triton's key (:mod:`kiln_triton.known_binaries`)."""
    fn, launch = KERNELS[kernel]
    warps, stages = launch(args["HEAD_DIM"], getattr(torch, buffers["Q"][0]))
    grid = tuple(grid)
    dtypes = {name: dtype for name, (dtype, _) in buffers.items()}
    capability = list(torch.cuda.get_device_capability(device))
    entry = known_binaries.jit_entry(fn, [kernel, args, dtypes, warps, stages, capability])
    loaded_as = (entry, device, torch.cuda.current_device())  # a handle is the device's
    compiled = _loaded.get(loaded_as) or known_binaries.recall_jit(fn, entry)
    if compiled is None:
        tensors = {
            name: torch.zeros(span, dtype=getattr(torch, dtype), device=device)
            for name, (dtype, span) in buffers.items()
        }
        compiled = fn.run(**tensors, grid=grid, warmup=True, num_warps=warps,
                          num_stages=stages, **args)  # fmt: skip
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        known_binaries.remember_jit(entry, compiled)
    compiled[grid]  # loads the module: its function handle exists from here on
    if entry is not None:
        _loaded[loaded_as] = compiled  # the twelve layers of a model load one binary
    return compiled, grid
