"""Kiln's attention kernels by the names a native host program's records give them, and
their compilation from a record's plain data."""

from __future__ import annotations

import torch

from kiln_triton.attention import attention_fwd, forward_launch
from kiln_triton.attention_backward import attention_bwd, backward_launch

# name -> (kernel, its (warps, pipeline stages) for a head size and dtype)
KERNELS = {
    "attention_fwd": (attention_fwd, forward_launch),
    "attention_bwd": (attention_bwd, backward_launch),
}


def compile_attention(kernel: str, args: dict, grid: list, buffers: dict, device: str):
    """``kernel`` compiled for these arguments (``plain_compile_args`` of
    :mod:`kiln_triton.attention`), on zero-filled buffers of these dtypes and element spans.
    Plain data, so a cache entry can compile it again."""
    tensors = {
        name: torch.zeros(span, dtype=getattr(torch, dtype), device=device)
        for name, (dtype, span) in buffers.items()
    }
    fn, launch = KERNELS[kernel]
    warps, stages = launch(args["HEAD_DIM"], tensors["Q"].dtype)
    grid = tuple(grid)
    compiled = fn.run(**tensors, grid=grid, warmup=True, num_warps=warps, num_stages=stages,
                      **args)  # fmt: skip
    if hasattr(compiled, "result"):
        compiled = compiled.result()
    compiled[grid]  # loads the module: its function handle exists from here on
    return compiled, grid
