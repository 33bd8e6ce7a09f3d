"""Kernels compiled before their first launch, with Kiln's own specialization.

Triton's launcher derives a kernel's specialization from each call's arguments (pointer
alignment, integers equal to 1 or divisible by 16) and compiles per specialization. For a
kernel with static sizes Kiln knows all of that when the graph compiles, so it states the
specialization itself and calls ``triton.compile`` directly:

- tensors are pointers of their dtype, assumed 16-byte aligned (the launcher takes this
  binary only for aligned calls, see ``TritonKernel._aligned``; others go through Triton's
  launcher, which compiles its own); so is a split reduction's workspace;
- each numel is a runtime ``i32`` (``i64`` past 32 bits), marked divisible by 16 where it
  is (it is a number fixed for the launch); so are a split reduction's chunk length and
  chunk count;
- block sizes and ``INDEX64`` are the constants, ``num_warps``/``num_stages`` the options.

A job (:func:`compile_job`) is plain data, compiled in a worker process
(:mod:`kiln_triton.compile_pool`) into Triton's on-disk cache by :func:`load`, which this
process calls too and which then finds the worker's binary there (a later process finds
it under the key the compile remembered, :mod:`kiln_triton.known_binaries`). The result
is kept per (source, configuration, numels) for every kernel of that source
(:func:`binary`), and launched through the compiled kernel's own launcher.
"""

from __future__ import annotations

import functools
import threading

from kiln_triton import known_binaries
from kiln_triton.configs import Config

DIVISIBLE_BY_16 = [["tt.divisibility", 16]]
# torch dtype names as Triton's pointer element types (bool is u1, as Triton's launcher says)
ELEMENT_TYPES = {
    "float64": "fp64",
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "u1",
}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# (kernel source hash, configuration, numels) -> the CompiledKernel made for it (a split
# reduction's: the pair of its chunks' kernel and its finish)
_BINARIES: dict[tuple[str, Config, tuple[int, ...]], object] = {}


def binary(source_hash: str, config: Config, numels: tuple[int, ...]):
    """The kernel compiled ahead for this launch (32-bit indices; a pair for a split
    reduction), or None."""
    return _BINARIES.get((source_hash, config, numels))


def keep(source_hash: str, config: Config, numels: tuple[int, ...], compiled) -> None:
    _BINARIES[(source_hash, config, numels)] = compiled


def start_driver_in_background() -> None:
    """Start Triton's driver in a thread (once). With an empty Triton cache it first builds
    its C utilities (a C compiler's run, about a second), which then overlaps the first
    call's capture and tracing instead of delaying its first kernels' compile."""
    global _driver_start
    if _driver_start is None:
        _driver_start = threading.Thread(
            target=_start_driver, name="kiln-triton-driver", daemon=True
        )
        _driver_start.start()


_driver_start: threading.Thread | None = None


def _start_driver() -> None:
    try:
        from triton.runtime import driver

        driver.active.get_current_target()
    except Exception:  # noqa: BLE001 - the first compile starts it, and says what fails
        return


@functools.cache
def current_target() -> tuple[str, int, int]:
    """The current device's ``GPUTarget`` as plain data (read once: it starts Triton's
    driver, which first builds its C utilities into an empty Triton cache; where
    :func:`start_driver_in_background` began that, this waits for it)."""
    from triton.runtime import driver

    if _driver_start is not None:
        _driver_start.join()  # one start: not a second build of the utilities beside it

    target = driver.active.get_current_target()
    return (target.backend, target.arch, target.warp_size)


def triton_cache_dir() -> str:
    """Triton's on-disk cache as this process sees it (the workers compile into it)."""
    from triton import knobs

    return str(knobs.cache.dir)


def compile_job(
    fn,
    path: str,
    args: list[str | int],
    constants: dict,
    options: dict,
    target: tuple[str, int, int],
) -> dict:
    """``triton.compile``'s arguments for ``fn`` (a ``@triton.jit`` function of the
    module at ``path``) called with ``args`` (a tensor's dtype name for each tensor, the
    number itself for each integer or float), then ``constants``: plain data for a
    worker."""
    signature: dict[str, str] = {}
    attrs: dict[tuple[int], list] = {}
    for i, name in enumerate(fn.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif isinstance(arg := args[i], str):
            if arg not in ELEMENT_TYPES:
                raise ValueError(f"{name}: no Triton pointer type for {arg}")
            signature[name] = "*" + ELEMENT_TYPES[arg]
            attrs[(i,)] = DIVISIBLE_BY_16
        elif isinstance(arg, float):
            signature[name] = "fp32"  # as Triton's launcher types a Python float
        else:
            signature[name] = "i32" if INT32_MIN <= arg <= INT32_MAX else "i64"
            attrs[(i,)] = DIVISIBLE_BY_16 if arg % 16 == 0 else []
    return {
        "path": path,
        "module": fn.fn.__module__,
        "function": fn.__name__,
        "signature": signature,
        "constexprs": {name: constants[name] for name in fn.arg_names if name in constants},
        "attrs": attrs,
        "options": options,
        "target": target,
        "cache_dir": triton_cache_dir(),
        "binaries_dir": str(known_binaries.folder()),  # a worker need not work it out
    }


def load(fn, job: dict):
    """The ``CompiledKernel`` of ``job``: the one ``triton.compile`` call a worker makes to
    compile it into Triton's cache and this process makes to find it there (the same call,
    so the same cache key; compiled here, were it not there). ``fn`` is the job's
    ``@triton.jit`` function as the caller imported it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn, job["signature"], job["constexprs"], job["attrs"])
    entry = known_binaries.entry(source, job)
    found = known_binaries.recall(source, entry)  # without computing Triton's cache key
    if found is not None:
        return found
    compiled = triton.compile(source, target=GPUTarget(*job["target"]), options=job["options"])
    known_binaries.remember(entry, compiled)
    return compiled
