"""Compile time of a set of kernels for a GPU target: threads (Triton's front end holds the
GIL) against compile worker processes. Compile only, so it runs without a GPU.

The kernels are kiln-loopir's op table (``kiln_loopir.testing.cases``: pointwise kernels,
reductions, scans, special functions) rendered by kiln-triton, each with up to
``--configs`` of its launch configurations, compiled for sm_90 into a fresh Triton cache
per run:

- ``serial``: ``triton.compile`` one job after the other in this process;
- ``threads``: the same calls from ``--workers`` threads (what ``AsyncCompileMode`` does);
- ``workers``: :func:`kiln_triton.codegen.compile_in_workers` with ``--workers`` compile
  processes, started at the beginning of the measured time, each binary loaded back here.

    python packages/kiln-triton/benchmarks/bench_compile_workers.py --workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: the kernels are compiled, not interpreted")

SM90 = ("cuda", 90, 32)


def rendered_kernels(limit: int | None) -> list:
    """The op table's kernels (first dtype of each case) as ``TritonKernel``s, once each."""
    import torch

    from kiln_loopir.testing import compile_fn
    from kiln_loopir.testing.cases import CASES
    from kiln_triton import TritonCodegen, TritonCodegenError
    from kiln_triton.codegen import load_module
    from kiln_triton.launcher import TritonKernel
    from kiln_triton.render import kernel_label

    codegen = TritonCodegen(parallel_compile=False)
    kernels: dict[str, TritonKernel] = {}
    for name, case in sorted(CASES.items()):
        try:
            with torch.no_grad():
                graph = compile_fn(case.fn, case.inputs(case.dtypes[0]), codegen="reference")
            sources = [codegen.render(k) for k in graph.schedule.kernels()]
        except (TritonCodegenError, NotImplementedError, RuntimeError) as exc:
            print(f"  {name}: not rendered ({type(exc).__name__})", file=sys.stderr)
            continue
        for source in sources:
            module, digest = load_module(source)
            if not module.META["sizes"]:
                kernels.setdefault(digest, TritonKernel(module, digest, kernel_label(source)))
    return list(kernels.values())[:limit]


def planned(kernels: list, configs: int) -> list[tuple]:
    """(kernel, config, numels): up to ``configs`` candidates of each kernel, no splits."""
    from kiln_triton.configs import candidates

    jobs = []
    for k in kernels:
        numels = k.numels(())
        if any(n == 0 for n in numels.values()):
            continue
        chosen = [c for c in candidates(k.meta, numels) if not c.variant.endswith("_split")]
        jobs += [(k, c, numels) for c in chosen[:configs]]
    return jobs


def fresh_triton_cache(label: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"bench-{label}-")


def in_process(jobs: list[tuple], threads: int) -> tuple[float, int]:
    from kiln_triton import precompiled

    def build(job) -> bool:
        kernel, config, numels = job
        fn = getattr(kernel.module, config.variant)
        try:
            precompiled.load(fn, kernel.compile_job(config, numels, SM90))
            return True
        except Exception:  # noqa: BLE001 - counted
            return False

    started = time.perf_counter()
    if threads <= 1:
        ok = sum(build(j) for j in jobs)
    else:
        with ThreadPoolExecutor(threads) as pool:
            ok = sum(pool.map(build, jobs))
    return time.perf_counter() - started, ok


def front_end_share(jobs: list[tuple]) -> tuple[float, float, float]:
    """Serially, into a fresh cache: seconds in the front end (AST to TTIR, Python under
    the GIL), this process's CPU seconds, and its child processes' (ptxas)."""
    from triton.compiler import ASTSource

    fresh_triton_cache("front-end")
    spent = [0.0]
    make_ir = ASTSource.make_ir

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return make_ir(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    ASTSource.make_ir = timed
    before = os.times()
    try:
        in_process(jobs, 1)
    finally:
        ASTSource.make_ir = make_ir
    after = os.times()
    own = after.user + after.system - before.user - before.system
    children = after.children_user + after.children_system
    children -= before.children_user + before.children_system
    return spent[0], own, children


def in_workers(jobs: list[tuple], workers: int) -> tuple[float, int, float]:
    """Seconds, binaries, and the CPU seconds the workers (and their ptxas) spent: on idle
    cores the wall time nears that over the number of workers."""
    from kiln_triton.codegen import compile_in_workers
    from kiln_triton.compile_pool import CompileWorkers

    before = os.times()
    started = time.perf_counter()
    pool = CompileWorkers(workers)
    ok, _ = compile_in_workers(jobs, pool, SM90)
    seconds = time.perf_counter() - started
    pool.shutdown()  # waits for the workers: their CPU time is counted from here
    after = os.times()
    cpu = after.children_user + after.children_system
    cpu -= before.children_user + before.children_system
    return seconds, ok, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--configs", type=int, default=2, help="candidates per kernel")
    parser.add_argument("--limit", type=int, default=None, help="kernels at most")
    parser.add_argument("--skip-serial", action="store_true")
    args = parser.parse_args()

    os.environ.setdefault("KILN_TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="bench-kernels-"))
    started = time.perf_counter()
    kernels = rendered_kernels(args.limit)
    jobs = planned(kernels, args.configs)
    print(
        f"{len(kernels)} kernels, {len(jobs)} launch configurations "
        f"(rendered in {time.perf_counter() - started:.1f} s), sm_90, {args.workers} workers"
    )
    if not args.skip_serial:
        fresh_triton_cache("serial")
        seconds, ok = in_process(jobs, 1)
        print(f"serial    {seconds:7.2f} s  ({ok} compiled)")
        front, own, children = front_end_share(jobs)
        print(
            f"          front end (AST to TTIR) {front:.2f} s; CPU: {own:.2f} s in this "
            f"process, {children:.2f} s in ptxas"
        )
    fresh_triton_cache("threads")
    seconds, ok = in_process(jobs, args.workers)
    print(f"threads   {seconds:7.2f} s  ({ok} compiled, {args.workers} threads)")
    fresh_triton_cache("workers")
    seconds, ok, cpu = in_workers(jobs, args.workers)
    print(f"workers   {seconds:7.2f} s  ({ok} compiled, {args.workers} processes, with start-up)")
    print(f"          CPU in the workers and their ptxas: {cpu:.2f} s (start-up included)")
    load, _ = in_process(jobs, 1)  # the workers' cache: what this process does per binary
    print(f"          loading the {ok} binaries back (cache hits): {load:.2f} s of it")


if __name__ == "__main__":
    main()
