"""Kiln's attention kernels by the names a native host program's records give them, and
their compilation from a record's plain data.

A record's kernel is compiled as the compile workers compile a graph's kernels
(:mod:`kiln_triton.precompiled`): one ``triton.compile`` of a job that states the
specialization Triton's launcher would give the call (pointers 16-byte aligned, integers
divisible by 16 or not, an integer equal to 1 a constant). :func:`compile_ahead` hands a
graph's jobs to the workers before its kernels are waited for, so that planning its
launches finds them built; :func:`compile_attention` loads the binary (compiling it here
where no worker did), without Triton's cache key where an earlier process compiled it
(:mod:`kiln_triton.known_binaries`).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import torch

from kiln_triton import attention_backward_jit, attention_jit, precompiled
from kiln_triton.attention import forward_launch
from kiln_triton.attention_backward import backward_launch
from kiln_triton.compile_pool import compile_workers
from kiln_triton.compiled_launch import load_function

log = logging.getLogger(__name__)

# name -> (kernel, its (warps, pipeline stages) for a head size and dtype)
KERNELS = {
    "attention_fwd": (attention_jit.attention_fwd, forward_launch),
    "attention_bwd": (attention_backward_jit.attention_bwd, backward_launch),
}
# binaries loaded in this process, by job, device and current device
_loaded: dict[tuple[str, str, int], object] = {}
# jobs handed to the compile workers (by repr), until a compile_attention waits for them
_compiling: dict[str, Future] = {}


def attention_job(kernel: str, args: dict, buffers: dict) -> dict:
    """The compile job of ``kernel`` for these arguments and pointer dtypes (``buffers``:
    name -> [dtype, element span]), specialized as Triton's launcher specializes a call."""
    fn, launch = KERNELS[kernel]
    warps, stages = launch(args["HEAD_DIM"], getattr(torch, buffers["Q"][0]))
    declared = {param.name for param in fn.params if param.is_constexpr}
    constants = {
        name: value
        for name, value in args.items()
        if name in declared or (type(value) is int and value == 1)
    }
    values = [buffers[name][0] if name in buffers else args[name] for name in fn.arg_names]
    options = {"num_warps": warps, "num_stages": stages}
    path = fn.fn.__code__.co_filename  # the module a worker imports (by its name)
    job = precompiled.compile_job(
        fn, path, values, constants, options, precompiled.current_target()
    )
    job["launcher"] = False  # the native host program launches it, never Triton's launcher
    return job


def compile_ahead(records: list[dict]) -> int:
    """Hand the compiles of these kernels (each ``plain_compile_args`` of
    :mod:`kiln_triton.attention`) to the compile workers, where there are any and a
    compile is not already under way; returns how many were handed over."""
    workers = compile_workers()
    if workers is None:
        return 0
    handed = 0
    for record in records:
        job = attention_job(record["kernel"], record["args"], record["buffers"])
        key = repr(job)
        if key not in _compiling and not any(k[0] == key for k in _loaded):
            _compiling[key] = workers.submit(job)
            handed += 1
    return handed


def compile_attention(kernel: str, args: dict, grid: list, buffers: dict, device: str):
    """``kernel`` compiled for these arguments (``plain_compile_args`` of
    :mod:`kiln_triton.attention`) and loaded on ``device``, with its grid. Plain data, so a
    cache entry can compile it again."""
    job = attention_job(kernel, args, buffers)
    key = repr(job)
    grid = tuple(grid)
    loaded_as = (key, device, torch.cuda.current_device())  # a handle is the device's
    compiled = _loaded.get(loaded_as)
    if compiled is None:
        _wait_for_worker(key)
        compiled = precompiled.load(KERNELS[kernel][0], job)
        load_function(compiled)  # only the native host program launches it: no launcher
        _loaded[loaded_as] = compiled  # the twelve layers of a model load one binary
    return compiled, grid


def _wait_for_worker(key: str) -> None:
    """Wait for the worker compiling the job ``key``, where one was handed it (a failure
    there leaves the compile to this process, whose error then reaches the caller)."""
    future = _compiling.pop(key, None)
    if future is None:
        return
    try:
        future.result()
    except Exception as exc:  # noqa: BLE001 - compiled again here
        log.debug("compiling an attention kernel in a worker failed: %s", exc)
