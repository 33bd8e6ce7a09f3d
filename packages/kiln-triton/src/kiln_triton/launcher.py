"""The callable the host program launches: ``kernel(*tensors, *sizes)``.

On the first call at some sizes it evaluates the kernel's block counts (``META['numels']``),
picks a launch configuration (timed on the GPU for big kernels, remembered on disk; see
:mod:`kiln_triton.autotune`) and whether indices need 64 bits; later calls at the same
sizes go straight to the launch.

A kernel whose sizes are arguments meets a new size at every call of a decode loop. Triton
compiles a kernel for a *specialization* of its integer arguments (whether each is 1, a
multiple of 16, and fits 32 bits), not for their values: a new size whose specialization
and configuration match an earlier one's launches that compiled kernel directly with its
own grid, without going through Triton's per-call dispatch. At most ``MAX_SIZES`` sizes
keep their launch (the oldest planned goes first).
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass

import torch

from kiln_loopir import size_math
from kiln_triton import autotune, precompiled
from kiln_triton.configs import Config, candidates, next_pow2
from kiln_triton.device import INTERPRET
from kiln_triton.variants import SPECIALIZE_SIZES, jit_function

INT32_LIMIT = 2**31 - 1 - 2**16  # indices in 32 bits, with room for one block past the end
# repeated calls launch through the compiled kernel's own launcher, skipping Triton's
# per-call argument specialization (KILN_TRITON_DIRECT_LAUNCH=0 goes through Triton's)
DIRECT_LAUNCH = os.environ.get("KILN_TRITON_DIRECT_LAUNCH", "1") == "1"
MAX_SIZES = 256  # sizes whose launch a kernel keeps
_COMPILED_AT_LAUNCH = [0]  # see compiled_at_launch
# per kernel source, its compiled kernels by (configuration, 64-bit indices, integer
# specialization): every TritonKernel of one source shares them, as it shares its module
# (a graph loaded again, or a second model of the same code, launches what the first
# compiled instead of compiling it again)
_COMPILED_BY_SOURCE: dict[str, dict[tuple, object]] = {}
FINISH_WARPS = 4  # a split reduction's finish


def compiled_at_launch() -> int:
    """Launches so far (this process) that found no compiled kernel of their own and went
    through Triton's launcher, which compiled one or read it from its caches: a kernel
    whose sizes are arguments meets one at a new configuration or specialization."""
    return _COMPILED_AT_LAUNCH[0]


@dataclass
class SplitLaunch:
    """The second launch of a split reduction and its workspace (see
    :mod:`kiln_triton.split`); the workspace is kept for later calls at the same sizes."""

    finish: object
    grid: tuple[int, ...]
    kwargs: dict
    rsplit: int
    nsplit: int
    workspace_size: int
    workspace: torch.Tensor | None = None
    compiled: tuple = ()  # the chunks' and the finish's kernels, where compiled ahead

    def workspace_on(self, device: torch.device) -> torch.Tensor:
        """The workspace, made on ``device`` at the first launch there."""
        if self.workspace is None or self.workspace.device != device:
            self.workspace = torch.empty(self.workspace_size, dtype=torch.float32, device=device)
        return self.workspace


@dataclass
class Launch:
    fn: object
    grid: tuple[int, ...]
    numels: tuple[int, ...]
    kwargs: dict
    config: Config
    # from the start where a compile worker compiled it (codegen.precompile), else after
    # the first launch: the compiled kernel's own launcher and the arguments after the
    # sizes, which skips Triton's per-call specialization (valid while pointers stay
    # 16-byte aligned, as they were when it was compiled)
    runner: object = None
    compiled: object = None  # the compiled kernel the runner launches
    tail: tuple = ()
    split: SplitLaunch | None = None
    # what Triton compiled the kernel for, where its sizes are arguments (see size_specialization)
    specialization: tuple = ()

    def call(self, args: tuple) -> None:
        """Launch through Triton's launcher (both launches of a split reduction)."""
        s = self.split
        if s is None:
            self.fn[self.grid](*args, *self.numels, **self.kwargs)
            return
        workspace = s.workspace_on(args[0].device)  # type: ignore[attr-defined]
        self.fn[self.grid](*args, *self.numels, workspace, s.rsplit, **self.kwargs)
        s.finish[s.grid](*args, *self.numels, workspace, s.nsplit, s.rsplit, **s.kwargs)


def _span(t: torch.Tensor) -> int:
    """Elements from ``t``'s first element to one past its last."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))


def size_specialization(n: int) -> tuple[bool, bool, bool]:
    """What Triton's compile of a kernel assumes of an integer argument: whether it is 1
    (then a constant), a multiple of 16, and within 32 bits. Only that last one where
    sizes are not specialized (:data:`~kiln_triton.variants.SPECIALIZE_SIZES`, the
    default): a block count Triton still specializes then is the same at every size, so
    what its compile assumed holds at every size too."""
    fits = -(2**31) <= n < 2**31
    if not SPECIALIZE_SIZES:
        return (False, False, fits)
    return (n == 1, n % 16 == 0, fits)


def runs_at(compiled_for: tuple, wanted: tuple) -> bool:
    """Whether a kernel compiled for specialization ``compiled_for`` runs a launch of
    specialization ``wanted``: the same configuration and index width, and each integer
    assumed 1, a multiple of 16 or 32-bit only where it is (a kernel compiled for sizes
    that are not multiples of 16 runs one that is)."""
    if compiled_for[:2] != wanted[:2] or len(compiled_for) != len(wanted):
        return False
    return all(
        not assumed or holds
        for c, w in zip(compiled_for[2:], wanted[2:], strict=True)
        for assumed, holds in zip(c, w, strict=True)
    )


def covers(config: Config, wanted: Config) -> bool:
    """Whether ``config`` launches the variant of ``wanted`` with blocks at least as large
    along every dimension (a persistent reduction's block still holds the whole row)."""
    have = dict(config.blocks)
    return (
        config.variant == wanted.variant
        and have.keys() == dict(wanted.blocks).keys()
        and all(have[name] >= block for name, block in wanted.blocks)
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_chunks(rnumel: int, rblock: int, nsplit: int) -> tuple[int, int]:
    """``(rsplit, nsplit)``: chunks of the reduction a whole number of ``rblock`` long,
    ``nsplit`` of them at most."""
    rsplit = _cdiv(_cdiv(rnumel, nsplit), rblock) * rblock
    return rsplit, _cdiv(rnumel, rsplit)


def direct_runner(kernel, grid: tuple[int, int, int]):
    """``runner(*args)`` launching a compiled Triton kernel on the current stream: its
    driver launcher called straight, skipping the per-call hook and metadata lookups of
    ``kernel[grid]`` while no launch hook is set (with one set, ``kernel[grid]`` itself)."""
    if launch_hooks_set():
        return kernel[grid]
    kernel[grid]  # loads the module: run, function and packed_metadata exist from here on
    run, function, metadata = kernel.run, kernel.function, kernel.packed_metadata
    stream_of, device_now = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
    g0, g1, g2 = grid

    def runner(*args):
        run(g0, g1, g2, stream_of(device_now()), function, metadata, None, None, None, *args)

    return runner


def launch_hooks_set() -> bool:
    """Whether Triton has a launch hook to call (a profiler's). Newer Triton keeps its hooks
    in chains that are never None: an empty chain is no hook."""
    from triton import knobs

    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(h is not None and getattr(h, "calls", True) for h in hooks)


class TritonKernel:
    def __init__(self, module: types.ModuleType, source_hash: str, name: str) -> None:
        self.module = module
        self.meta: dict = module.META
        self.name = name
        self.source_hash = source_hash
        self._nargs = len(self.meta["args"])
        self._nsizes = len(self.meta["sizes"])
        self._stored = [i for i, a in enumerate(self.meta["args"]) if a in self.meta["stored"]]
        names = list(self.meta["numels"])
        exprs = ", ".join(self.meta["numels"][n] for n in names)
        params = ", ".join(self.meta["sizes"])
        scope = dict(size_math.FUNCTIONS)  # sizes such as CeilToInt(x) print as ceil_to_int(x)
        self._numels = eval(f"lambda {params}: ({exprs},)", scope)  # noqa: S307 - generated
        self._numel_names = names
        self._launches: dict[tuple, Launch | None] = {}
        self._compiled = _COMPILED_BY_SOURCE.setdefault(source_hash, {})
        self._tuning_dir = autotune.cache_dir()  # the compile's, kept for the first launches
        self.configs_timed = 0

    def __repr__(self) -> str:
        return f"TritonKernel({self.name})"

    def __call__(self, *args: object) -> None:
        sizes = tuple(int(s) for s in args[self._nargs :]) if self._nsizes else ()
        launch = self._launches.get(sizes, False)
        if launch is False:
            launch = self._plan(args, sizes)
            if len(self._launches) >= MAX_SIZES:
                del self._launches[next(iter(self._launches))]
            self._launches[sizes] = launch
        if launch is None:  # nothing to compute
            return
        if self._run(launch, args):
            return
        if launch.runner is None and launch.split is None and DIRECT_LAUNCH and not INTERPRET:
            self._direct(launch, args)

    def _run(self, launch: Launch, args: tuple) -> bool:
        """Launch directly where it can (returns True), else through Triton's launcher."""
        if launch.runner is not None and self._aligned(args):
            launch.runner(*args, *launch.tail)
            return True
        launch.call(args)
        return False

    def _aligned(self, args: tuple) -> bool:
        """Whether every tensor argument is 16-byte aligned, as the direct path assumes."""
        return not any(a.data_ptr() & 15 for a in args[: self._nargs])

    def _direct(self, launch: Launch, args: tuple) -> None:
        """Keep the compiled kernel's launcher for the next calls (aligned pointers only)."""
        if not self._aligned(args):
            return
        _COMPILED_AT_LAUNCH[0] += 1
        kernel = launch.fn.run(
            *args, *launch.numels, grid=launch.grid, warmup=True, **launch.kwargs
        )
        if hasattr(kernel, "result"):
            kernel = kernel.result()
        self._launch_compiled(launch, kernel)

    def _launch_compiled(self, launch: Launch, kernel) -> None:
        """Launch ``kernel`` (compiled for aligned pointers) directly from now on."""
        after = self._nargs + self._nsizes + len(launch.numels)  # tensors, sizes, numels
        launch.tail = (*launch.numels, *_constants_after(launch.fn, after, launch.kwargs))
        launch.runner = direct_runner(kernel, (*launch.grid, 1, 1)[:3])
        launch.compiled = kernel
        if launch.specialization:
            self._compiled.setdefault(launch.specialization, kernel)

    def _reuse_compiled(self, launch: Launch) -> None:
        """Launch directly with the kernel compiled for an earlier size of the same
        specialization, else with one of the same configuration that assumed no more of
        each integer than holds of this size's (see :func:`runs_at`), where there is one."""
        kernel = self._compiled.get(launch.specialization)
        if kernel is None:
            kernel = next(
                (k for spec, k in self._compiled.items() if runs_at(spec, launch.specialization)),
                None,
            )
        if kernel is not None:
            self._launch_compiled(launch, kernel)

    # -- planning -------------------------------------------------------------------------------
    def numels(self, sizes: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(self._numel_names, (int(n) for n in self._numels(*sizes)), strict=True))

    def _plan(self, args: tuple, sizes: tuple[int, ...]) -> Launch | None:
        if len(args) != self._nargs + len(self.meta["sizes"]):
            raise TypeError(
                f"{self.name} takes {self._nargs} tensors and {len(self.meta['sizes'])} sizes, "
                f"got {len(args)} arguments"
            )
        tensors = args[: self._nargs]
        for a in tensors:
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"{self.name}: expected a tensor, got {a!r}")
            if a.device.type != "cuda" and not INTERPRET:
                raise TypeError(
                    f"{self.name}: got a tensor on {a.device}; Triton kernels run on CUDA "
                    "tensors (or on CPU tensors under TRITON_INTERPRET=1)"
                )
        numels = self.numels(sizes)
        if any(n == 0 for k, n in numels.items() if k != "rnumel"):
            return None
        points = 1
        for n in numels.values():
            points *= max(n, 1)
        biggest = max([points] + [_span(t) for t in tensors])  # type: ignore[arg-type]
        index64 = biggest > INT32_LIMIT
        configs = candidates(self.meta, numels)
        config = configs[0]
        timed = not INTERPRET and autotune.worth_timing(self.meta["kind"], points)
        if timed and len(configs) > 1:
            config = self._tune(configs, tensors, sizes, numels, index64)
        elif not timed and self._nsizes and DIRECT_LAUNCH and not INTERPRET:
            config = self.compiled_cover(config, index64, (*sizes, *numels.values()))
        return self._launch_at(config, numels, index64, sizes)

    def compiled_cover(self, config: Config, index64: bool, values: tuple) -> Config:
        """For a kernel too small to time, at a new size (``values``: its sizes, then its
        block counts): ``config`` where a kernel compiled for it runs the size, else a
        configuration of compiled blocks at least as large that runs it (the launch
        costs what the blocks do not: a size between two met before takes a compiled
        kernel instead of a compile), else ``config``."""
        wanted = (config, index64, *map(size_specialization, values))
        found = [spec[0] for spec in self._compiled if runs_at(spec, (spec[0], *wanted[1:]))]
        if config in found:
            return config
        return next((c for c in found if covers(c, config)), config)

    def _launch(self, config: Config, numels: dict[str, int], index64: bool) -> Launch:
        blocks = dict(config.blocks)
        nsplit = blocks.pop("NSPLIT", 0)
        if self.meta["kind"] == "tiled":
            grid = (
                -(-numels["ynumel"] // blocks["YBLOCK"]) * -(-numels["xnumel"] // blocks["XBLOCK"]),
            )
        else:
            grid = (-(-numels["xnumel"] // blocks["XBLOCK"]),)
        kwargs = {**blocks, "INDEX64": index64}
        if not INTERPRET:
            kwargs.update(num_warps=config.num_warps, num_stages=config.num_stages)
        fn = jit_function(self.module, config.variant)
        launch = Launch(fn, grid, tuple(numels.values()), kwargs, config)
        if nsplit:
            launch.split = self._split(launch, blocks, numels, nsplit, index64)
        if not index64 and DIRECT_LAUNCH and not INTERPRET:
            kernel = precompiled.binary(self.source_hash, config, launch.numels)
            if kernel is None:  # not compiled when the graph compiled (codegen.precompile)
                return launch
            if launch.split is not None:
                self._launch_split_compiled(launch, *kernel)
            else:
                self._launch_compiled(launch, kernel)
        return launch

    def _launch_at(self, config: Config, numels: dict[str, int], index64: bool, sizes: tuple):
        """:meth:`_launch` at ``sizes`` (the kernel's size arguments), launched directly
        from the first call where a kernel of its specialization was compiled before."""
        launch = self._launch(config, numels, index64)
        if self._nsizes and launch.split is None:
            launch.specialization = (
                config,
                index64,
                *map(size_specialization, (*sizes, *launch.numels)),
            )
            if launch.compiled is not None:  # compiled ahead for these sizes
                self._compiled.setdefault(launch.specialization, launch.compiled)
            elif DIRECT_LAUNCH and not INTERPRET:
                self._reuse_compiled(launch)
        return launch

    def _split(self, launch: Launch, blocks: dict, numels: dict, nsplit: int, index64: bool):
        """Chunks of the reduction a whole number of ``RBLOCK`` long, ``nsplit`` of them at
        most, and the finishing launch over the output blocks."""
        rsplit, nsplit = split_chunks(numels["rnumel"], blocks["RBLOCK"], nsplit)
        xblocks = launch.grid[0]
        launch.grid = (xblocks * nsplit,)
        kwargs = _finish_constants(blocks, nsplit, index64)
        if not INTERPRET:
            kwargs["num_warps"] = FINISH_WARPS
        finish = jit_function(self.module, f"{self.meta['name']}_split_finish")
        size = self.meta["split_parts"] * nsplit * numels["xnumel"]
        # with a loop after the reduction, each chunk's program finishes its own chunk
        grid = launch.grid if self.meta.get("split_epilogue") else (xblocks,)
        return SplitLaunch(finish, grid, kwargs, rsplit, nsplit, size)

    def _launch_split_compiled(self, launch: Launch, first, finish) -> None:
        """Launch a split reduction's two kernels (compiled for aligned pointers) directly
        from now on, with its workspace made at the first launch."""
        s, numels = launch.split, launch.numels
        run_first = direct_runner(first, (*launch.grid, 1, 1)[:3])
        run_finish = direct_runner(finish, (*s.grid, 1, 1)[:3])
        after = self._nargs + len(numels) + 1  # the tensors, the numels, the workspace
        first_tail = (s.rsplit, *_constants_after(launch.fn, after + 1, launch.kwargs))
        finish_tail = (s.nsplit, s.rsplit, *_constants_after(s.finish, after + 2, s.kwargs))
        workspace_on = s.workspace_on

        def runner(*tensors):
            workspace = workspace_on(tensors[0].device)
            run_first(*tensors, *numels, workspace, *first_tail)
            run_finish(*tensors, *numels, workspace, *finish_tail)

        launch.runner, launch.tail = runner, ()
        s.compiled = (first, finish)

    def warmup(self, config: Config, numels: dict[str, int]) -> None:
        """Compile ``config`` for these (static) sizes without launching it."""
        launch = self._launch(config, numels, False)
        dtypes = [getattr(torch, d) for d in self.meta["dtypes"]]
        launch.fn.warmup(*dtypes, *launch.numels, grid=launch.grid, **launch.kwargs)

    def compile_jobs(self, config: Config, numels: dict[str, int], target: tuple) -> list[dict]:
        """What a compile worker needs to compile ``config`` for these (static) sizes with
        Kiln's specialization (see :mod:`kiln_triton.precompiled`): one job, two for a split
        reduction (its chunks' kernel, then its finish)."""
        blocks = {k: v for k, v in config.blocks if k != "NSPLIT"}
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        tensors, sizes = list(self.meta["dtypes"]), list(numels.values())
        nsplit = dict(config.blocks).get("NSPLIT")
        if not nsplit:
            return [self._job(config.variant, [*tensors, *sizes], blocks, options, target)]
        rsplit, nsplit = split_chunks(numels["rnumel"], blocks["RBLOCK"], nsplit)
        finish = f"{self.meta['name']}_split_finish"
        return [
            self._job(config.variant, [*tensors, *sizes, "float32", rsplit], blocks, options,
                      target),
            self._job(finish, [*tensors, *sizes, "float32", nsplit, rsplit],
                      _finish_constants(blocks, nsplit, False), {"num_warps": FINISH_WARPS},
                      target),
        ]  # fmt: skip

    def _job(self, function: str, args: list, constants: dict, options: dict, target) -> dict:
        return precompiled.compile_job(
            jit_function(self.module, function), self.module.__file__, args,
            {**constants, "INDEX64": False}, options, target,
        )  # fmt: skip

    def adopt(self, config: Config, numels: dict[str, int], jobs: list[dict]):
        """Load the binaries a worker compiled for ``jobs`` (Triton's cache has them) and
        launch them at these sizes from now on: the kernel (a split reduction's pair)."""
        kernels = [precompiled.load(jit_function(self.module, j["function"]), j) for j in jobs]
        kernel = kernels[0] if len(kernels) == 1 else tuple(kernels)
        precompiled.keep(self.source_hash, config, tuple(numels.values()), kernel)
        return kernel

    def tuned_winner(
        self, numels: dict[str, int], sizes: tuple = (), device: str | None = None
    ) -> Config | None:
        """The configuration timed fastest before at these sizes on ``device`` (a device
        name; default: the current device's), from the on-disk autotuning cache, or None."""
        return autotune.load_winner(self._tuning_key(numels, sizes, device), self._tuning_dir)

    def _tuning_key(self, numels: dict[str, int], sizes: tuple, device: str | None) -> str:
        device = device or torch.cuda.get_device_name()
        return autotune.cache_key(self.source_hash, numels, sizes, device)

    def _tuned_under(self, numels: dict[str, int], sizes: tuple) -> tuple[dict[str, int], tuple]:
        """What a timing is kept under: the sizes themselves for a kernel compiled for static
        sizes; for one whose sizes are arguments, each numel's power-of-two bucket (a new
        size in a bucket takes the winner timed for it: a sequence that grows by one token
        a call times once per doubling)."""
        if not self._nsizes:
            return numels, sizes
        return {name: next_pow2(n) for name, n in numels.items()}, ()

    def _tune(self, configs, tensors, sizes, numels, index64) -> Config:
        device = torch.cuda.get_device_name(tensors[0].device) if tensors else "cuda"
        kept_numels, kept_sizes = self._tuned_under(numels, sizes)
        cached = self.tuned_winner(kept_numels, kept_sizes, device)
        if cached is not None and cached in configs:
            return cached
        # time on scratch copies of what the kernel writes: inputs stay as they are, even
        # when an output shares their storage (in place) or accumulates
        scratch = list(tensors)
        for i in self._stored:
            t = tensors[i]
            scratch[i] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

        def launch_with(config: Config):
            launch = self._launch(config, numels, index64)
            return lambda: self._run(launch, (*scratch, *sizes))

        best, timings = autotune.pick(configs, launch_with)
        self.configs_timed += len(timings)
        autotune.save_winner(
            self._tuning_key(kept_numels, kept_sizes, device), best, timings, self._tuning_dir
        )
        return best


def _finish_constants(blocks: dict, nsplit: int, index64: bool) -> dict:
    """The constants of a split reduction's finish over ``nsplit`` chunks."""
    return {
        "XBLOCK": blocks["XBLOCK"],
        "SPLIT_BLOCK": next_pow2(nsplit),
        "RBLOCK": blocks["RBLOCK"],
        "INDEX64": index64,
    }


def _constants_after(fn, first: int, kwargs: dict) -> tuple:
    """The values of ``fn``'s arguments from position ``first`` on (its constants, which
    a compiled kernel's launcher takes too), from ``kwargs``."""
    return tuple(kwargs[name] for name in fn.arg_names[first:])
