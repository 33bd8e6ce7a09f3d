"""``TritonCodegen``: kiln-loopir's codegen protocol for CUDA GPUs, as Triton kernels."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from kiln_cpp import cache_dirs
from kiln_loopir import compile_lock
from kiln_loopir.kernel import Kernel
from kiln_triton import autotune, known_binaries, precompiled
from kiln_triton.compile_pool import compile_workers, compiles_for_gpu, start_compile_workers
from kiln_triton.configs import candidates
from kiln_triton.launcher import DIRECT_LAUNCH, TritonKernel
from kiln_triton.render import kernel_label, render_kernel, source_hash
from kiln_triton.variants import load_kernel_module

log = logging.getLogger("kiln.triton")
# the kernel signatures whose Triton launcher a compile worker was asked to build
_SIGNATURES: set[tuple[str, ...]] = set()
_SIGNATURES_LOCK = threading.Lock()
_MODULES: dict[str, object] = {}  # source hash -> imported kernel module
_FOUND_ON_DISK: set[str] = set()  # kernels whose source an earlier process wrote
_UNCOUNTED: dict[str, str] = {}  # imported as they rendered: "built" or "reused", once counted
# kernels new to the cache, and kernels found in it or in this process (see kernel_counts)
_KERNEL_COUNTS = {"built": 0, "reused": 0}


def kernel_counts() -> dict[str, int]:
    """``{"built": n, "reused": m}``: kernels this process wrote and compiled, and kernels
    whose source it found (in this process, or in the on-disk cache)."""
    return dict(_KERNEL_COUNTS)


def load_module(source: str, count: bool = True):
    """Import a kernel's source (Triton reads a ``@triton.jit`` function's source from its
    file): written once to the cache under its hash, imported once per process. ``count``:
    counted in :func:`kernel_counts` now (else at the next counted load: a kernel imported
    as it rendered counts once its graph builds)."""
    digest = source_hash(source)
    if digest in _MODULES:
        if count:
            _KERNEL_COUNTS[_UNCOUNTED.pop(digest, "reused")] += 1
        return _MODULES[digest], digest
    folder = autotune.cache_dir() / "kernels"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"k{digest}.py"
    if count:
        _KERNEL_COUNTS["reused" if path.exists() else "built"] += 1
    else:
        _UNCOUNTED[digest] = "reused" if path.exists() else "built"
    if path.exists():
        _FOUND_ON_DISK.add(digest)
    else:
        tmp = path.with_suffix(f".py.{os.getpid()}")
        tmp.write_text(source)
        tmp.replace(path)
    module = load_kernel_module(path, f"{known_binaries.KERNEL_MODULE_PREFIX}{digest}", source)
    _MODULES[digest] = module
    return module, digest


def precompile(kernels: Sequence[TritonKernel]) -> int:
    """Compile the launch configurations of kernels with static sizes ahead of their first
    launch (Triton compiles on first launch otherwise, one kernel after the other): in the
    compile worker processes (:mod:`kiln_triton.compile_pool`), or in threads where there
    are none. Returns how many were compiled; a failure here is left for the launch to
    report."""
    if not compiles_for_gpu():
        return 0
    jobs = planned_jobs(kernels)
    if not jobs:
        return 0
    # the workers' binaries launch through the direct path only (KILN_TRITON_DIRECT_LAUNCH)
    if not DIRECT_LAUNCH:
        compiled, failures = _compile_in_threads(jobs)
    else:
        # a kernel whose source the cache held was compiled by an earlier process: its
        # binaries are in Triton's cache, loaded here without waiting for the workers
        known = [job for job in jobs if job[0].source_hash in _FOUND_ON_DISK]
        new = [job for job in jobs if job[0].source_hash not in _FOUND_ON_DISK]
        target = precompiled.current_target()
        compiled, failures = _load_in_process(known, target) if known else (0, [])
        if new:
            workers = compile_workers()
            more, also = (
                compile_in_workers(new, workers, target) if workers else _compile_in_threads(new)
            )
            compiled, failures = compiled + more, failures + also
    if failures and not compiled:  # not a config too big to compile: every one failed
        log.warning(
            "compiling %d launch configurations ahead of their first launch failed; they "
            "compile one by one when they launch (first failure: %s)",
            len(failures),
            failures[0],
        )
    return compiled


def planned_jobs(kernels: Sequence[TritonKernel]) -> list[tuple]:
    """``(kernel, config, numels)`` for each launch configuration the first launches of
    kernels with static sizes will need, once each, leaving out those compiled already."""
    jobs: dict[tuple, tuple] = {}
    for k in kernels:
        if k.meta["sizes"]:
            continue  # sizes known only at the first call
        numels = k.numels(())
        if any(n == 0 for n in numels.values()):
            continue
        configs = candidates(k.meta, numels)
        points = 1
        for n in numels.values():
            points *= n
        if not autotune.worth_timing(k.meta["kind"], points):
            configs = configs[:1]
        else:  # a winner timed before (this process or the cache) is all that will launch
            winner = k.tuned_winner(numels)
            configs = [winner] if winner in configs else configs
        for c in configs:
            if precompiled.binary(k.source_hash, c, tuple(numels.values())) is not None:
                continue
            jobs.setdefault((k.source_hash, c, tuple(numels.values())), (k, c, numels))
    return list(jobs.values())


def compile_in_workers(jobs: list[tuple], workers, target: tuple) -> tuple[int, list[str]]:
    """Compile ``jobs`` in the worker processes for ``target`` (those handed over as their
    kernel rendered are waited for, not handed over again), then load each binary here
    (Triton's cache has it) as the worker finishes it. Returns how many were compiled and
    the failures (kernel, config: error)."""
    failures: list[str] = []
    submissions = _hand_over(jobs, workers, target, failures)
    by_future = {future: s for s in submissions for future in s.futures}
    compiled, finished = 0, set()
    # another graph's compile may work meanwhile: loading a binary (Triton's cache and the
    # remembered keys, both safe from threads) needs no fake tensor and no device
    with compile_lock.waiting():
        for future in as_completed(by_future):
            s = by_future[future]
            if id(s) in finished or not all(f.done() for f in s.futures):
                continue  # a split reduction's other part is still compiling
            finished.add(id(s))
            error = s.finish()
            if error is None:
                compiled += 1
            else:
                _failed(failures, s.kernel, s.config, error)
    return compiled, failures


def compile_ahead(source: str) -> None:
    """Hand the launch configurations of a kernel that just rendered to the compile workers
    (those :func:`precompile` would hand them), so that they build while the graph's other
    kernels render; the graph's build then waits for them. Nothing is handed over where the
    workers would not build it (no GPU, no workers, the direct launch path off, a kernel an
    earlier process compiled, sizes known only at the first call); a failure here is left
    for the build to report."""
    if not (DIRECT_LAUNCH and compiles_for_gpu()):
        return
    workers = compile_workers()
    if workers is None:
        return
    try:
        module, digest = load_module(source, count=False)
        if digest in _FOUND_ON_DISK:
            return  # loaded here from Triton's cache when the graph builds
        kernel = TritonKernel(module, digest, kernel_label(source))
        _hand_over(planned_jobs([kernel]), workers, precompiled.current_target(), [])
    except Exception as exc:  # noqa: BLE001 - precompile hands it over and reports
        log.debug("compiling a kernel as it rendered: %s: %s", type(exc).__name__, exc)


class Submission:
    """A launch configuration handed to the compile workers: the futures of its jobs (two
    for a split reduction), and its binaries loaded here once, when they are all done."""

    def __init__(self, kernel, config, numels: dict, parts: list[dict], workers) -> None:
        self.kernel, self.config, self.numels, self.parts = kernel, config, numels, parts
        self.futures = [workers.submit(part) for part in parts]
        self._lock = threading.Lock()
        self._outcome: tuple[Exception | None] | None = None

    def finish(self) -> Exception | None:
        """Load the binaries (once; the jobs are done): None, or what failed."""
        with self._lock:
            if self._outcome is None:
                try:
                    for future in self.futures:
                        future.result()
                    self.kernel.adopt(self.config, self.numels, self.parts)
                    self._outcome = (None,)
                except Exception as exc:  # noqa: BLE001 - a failure: compiled at its launch
                    self._outcome = (exc,)
                with _IN_FLIGHT_LOCK:
                    _IN_FLIGHT.pop(self.key, None)
            return self._outcome[0]

    @property
    def key(self) -> tuple:
        return (self.kernel.source_hash, self.config, tuple(self.numels.values()))


# launch configurations handed to the workers and not yet loaded, by (source hash,
# configuration, numels): a graph's build waits for these instead of handing them over again
_IN_FLIGHT: dict[tuple, Submission] = {}
_IN_FLIGHT_LOCK = threading.Lock()


def _hand_over(jobs: list[tuple], workers, target: tuple, failures: list[str]) -> list:
    """The submission of each of ``jobs``: the one in flight, else a new one."""
    submissions = []
    for kernel, config, numels in jobs:
        key = (kernel.source_hash, config, tuple(numels.values()))
        with _IN_FLIGHT_LOCK:
            submission = _IN_FLIGHT.get(key)
            if submission is None:
                try:
                    parts = kernel.compile_jobs(config, numels, target)
                except Exception as exc:  # noqa: BLE001 - a type Kiln's specialization lacks
                    _failed(failures, kernel, config, exc)
                    continue
                for part in parts:
                    part["launcher"] = _first_of_its_signature(part)
                submission = _IN_FLIGHT[key] = Submission(kernel, config, numels, parts, workers)
        submissions.append(submission)
    return submissions


def _first_of_its_signature(job: dict) -> bool:
    """Whether ``job`` is this process's first of its kernel signature (argument types,
    constants in place): Triton's C launcher depends on nothing else, so only that job's
    worker builds it (about 0.4 s of gcc a job, half a BERT's compile in the workers)."""
    signature = tuple(job["signature"].values())
    with _SIGNATURES_LOCK:
        first = signature not in _SIGNATURES
        _SIGNATURES.add(signature)
    return first


def _failed(failures: list[str], kernel, config, exc: Exception) -> None:
    """Note a configuration that did not compile ahead: it compiles at its first launch,
    which reports an error that remains (:func:`precompile` warns where all failed)."""
    failures.append(f"{kernel.name} {config}: {type(exc).__name__}: {exc}")
    log.debug("precompiling %s", failures[-1])


def _load_in_process(jobs: list[tuple], target: tuple) -> tuple[int, list[str]]:
    """Load the binaries of ``jobs`` from Triton's cache in this process, a few threads at
    a time (one missing there is compiled here: correct, only slower)."""
    failures: list[str] = []

    def load(job) -> bool:
        kernel, config, numels = job
        try:
            kernel.adopt(config, numels, kernel.compile_jobs(config, numels, target))
            return True
        except Exception as exc:  # noqa: BLE001 - reported when the kernel launches
            _failed(failures, kernel, config, exc)
            return False

    with ThreadPoolExecutor(max_workers=min(8, len(jobs))) as pool:
        return sum(pool.map(load, jobs)), failures


def _compile_in_threads(jobs: list[tuple]) -> tuple[int, list[str]]:
    """Compile ``jobs`` through ``JITFunction.warmup`` in Triton's asynchronous compile
    mode, with ``$KILN_TRITON_COMPILE_THREADS`` threads (default: the CPU count)."""
    failures: list[str] = []

    def build(job) -> bool:
        kernel, config, numels = job
        try:
            kernel.warmup(config, numels)
            return True
        except Exception as exc:  # noqa: BLE001 - reported when the kernel launches
            _failed(failures, kernel, config, exc)
            return False

    # a split reduction's two kernels and workspace compile at its first launch
    jobs = [job for job in jobs if not job[1].variant.endswith("_split")]
    threads = int(os.environ.get("KILN_TRITON_COMPILE_THREADS", os.cpu_count() or 4))
    if threads <= 1:
        return sum(build(job) for job in jobs), failures
    # Triton's asynchronous compile mode: each warmup hands its compilation to the pool,
    # leaving the mode waits for all of them
    from triton.runtime._async_compile import AsyncCompileMode

    with (
        ThreadPoolExecutor(max_workers=threads) as pool,
        AsyncCompileMode(pool, ignore_errors=True),
    ):
        compiled = sum(build(job) for job in jobs)
    return compiled, failures


class TritonCodegen:
    """Renders kernels as Triton (see :mod:`kiln_triton.render`) and returns launchers that
    pick and cache launch configurations (:mod:`kiln_triton.launcher`). ``compile``
    compiles the kernels of a graph with static sizes in parallel (see :func:`precompile`).
    """

    name = "triton"
    device_types = ("cuda",)
    renders_scans = True  # cumulative ops: tl.associative_scan over rows (render.py)
    # the caller's cache root for a compile (kiln's cache_dir): kernels and autotuning
    # winners go to <root>/triton, the native host program's libraries to <root>/cpp
    cache_root = staticmethod(cache_dirs.cache_root)

    def __init__(self, parallel_compile: bool = True) -> None:
        self.parallel_compile = parallel_compile
        self.precompiled = 0

    @staticmethod
    def prepare() -> None:
        """Work a first compile will need, begun ahead (by ``kiln.compile()``), each in a
        thread: Triton's cache key of its installation (:mod:`kiln_triton.known_binaries`)
        and, where kernels compile for a GPU, Triton's driver."""
        known_binaries.compute_key_in_background()
        if compiles_for_gpu():
            precompiled.start_driver_in_background()

    def begin_compile(self) -> None:
        """Work the build of a graph's kernels needs, begun as the graph starts lowering
        (kiln-loopir calls this; a graph found in the cache lowers nothing): the compile
        workers, which start while it lowers and are ready for its first kernel."""
        if self.parallel_compile:
            start_compile_workers()

    def render(self, kernel: Kernel) -> str:
        source = render_kernel(kernel)
        if self.parallel_compile:  # built while the next ones render (workers started)
            compile_ahead(source)
        return source

    def compile(self, sources: Sequence[str]) -> list[Callable]:
        kernels = []
        for source in sources:
            module, digest = load_module(source)
            kernels.append(TritonKernel(module, digest, kernel_label(source)))
        if self.parallel_compile:
            self.precompiled += precompile(kernels)
        return kernels

    def prepare_host(self, schedule) -> None:
        """Work the graph's native host program will need, begun before its kernels
        render: the attention kernels it launches handed to the compile workers (see
        :func:`kiln_triton.native_host.compile_attention_ahead`). A failure here leaves
        that work to :meth:`build_host`."""
        from kiln_triton.native_host import compile_attention_ahead

        try:
            compile_attention_ahead(schedule)
        except Exception as exc:  # noqa: BLE001 - build_host compiles them itself
            log.debug("compiling attention kernels ahead: %s: %s", type(exc).__name__, exc)

    def build_host(self, schedule, plan, kernels: dict) -> object:
        """The graph's native host program, built after its kernels (see
        :mod:`kiln_triton.native_host`); raises ``HostNotRendered`` where the Python one
        runs the graph."""
        from kiln_triton.native_host import build_host

        return build_host(schedule, plan, kernels)

    def rebuild_host(self, data: dict, kernels: dict) -> object:
        """:meth:`build_host` again from a cache entry (see ``native_host.rebuild_host``)."""
        from kiln_triton.native_host import rebuild_host

        return rebuild_host(data, kernels)

    def __repr__(self) -> str:
        return "TritonCodegen()"
