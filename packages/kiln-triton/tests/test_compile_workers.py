"""Compile worker processes (compile_pool.py): a kernel compiled for a GPU target in a
worker is the binary this process loads, without compiling it again. No GPU needed: the
workers compile for sm_90 (ptxas ships with Triton); launching is test_gpu.py's."""

import os
import subprocess
import sys
import textwrap
import time
import types

import pytest
import torch
from triton.compiler import ASTSource

from kiln_loopir.testing import compile_fn
from kiln_triton import TritonCodegen, codegen, precompiled
from kiln_triton.compile_pool import CompileWorkerError, CompileWorkers, compile_workers
from kiln_triton.compiled_launch import ptx_params
from kiln_triton.configs import candidates
from kiln_triton.launcher import TritonKernel
from kiln_triton.render import source_hash
from kiln_triton.variants import jit_function, load_kernel_module

SM90 = ("cuda", 90, 32)


@pytest.fixture(scope="module")
def workers():
    pool = CompileWorkers(1)
    yield pool
    pool.shutdown()


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
    """A fresh Triton cache for this process and (through the jobs) the workers."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path / "triton"


def compiled_kernel(fn, inputs, folder, monkeypatch, edit=lambda s: s) -> TritonKernel:
    """``fn``'s one kernel rendered, written to ``folder`` and imported as compiled
    ``@triton.jit`` functions (not the interpreter's, which the tests run on)."""
    compiled = compile_fn(fn, inputs, codegen="reference")
    (kernel,) = compiled.schedule.kernels()
    source = edit(TritonCodegen(parallel_compile=False).render(kernel))
    digest = source_hash(source)
    path = folder / f"k{digest}.py"
    path.write_text(source)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read by triton.jit as each variant is made
    module = load_kernel_module(path, f"kiln_triton_kernel_{digest}", source)
    for name in [n for n, v in vars(module).items() if getattr(v, "__kiln_jit_later__", 0)]:
        jit_function(module, name)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return TritonKernel(module, digest, kernel.name)


def _scale(x):
    return x * 2 + 1


def count_compiles(monkeypatch) -> list[str]:
    """The kernels this process compiles from now on (each compile makes IR once)."""
    from triton.compiler import ASTSource

    made: list[str] = []
    make_ir = ASTSource.make_ir

    def counted(self, *args, **kwargs):
        made.append(self.name)
        return make_ir(self, *args, **kwargs)

    monkeypatch.setattr(ASTSource, "make_ir", counted)
    return made


def test_a_worker_compiles_for_a_gpu_target_and_this_process_loads_that_binary(
    workers, triton_cache, tmp_path, monkeypatch
):
    kernel = compiled_kernel(_scale, [torch.randn(64, 48)], tmp_path, monkeypatch)
    numels = kernel.numels(())
    config = candidates(kernel.meta, numels)[0]
    (job,) = kernel.compile_jobs(config, numels, SM90)
    assert job["signature"]["xnumel"] == "i32" and job["attrs"][(2,)] == [["tt.divisibility", 16]]

    reply = workers.submit(job).result(timeout=300)
    assert reply["pid"] != os.getpid() and reply["pid"] in workers.pids()
    made = count_compiles(monkeypatch)
    binary = kernel.adopt(config, numels, [job])
    assert made == [], "this process compiled the kernel again"
    assert binary.hash == reply["hash"]  # the worker's compile, found in Triton's cache
    entries = [p.read_text() for p in triton_cache.glob("*/*.json")]
    assert any(reply["hash"] in e for e in entries)  # made in the cache this test set up
    assert "cubin" in binary.asm and "sm_90" in binary.asm["ptx"]
    assert precompiled.binary(kernel.source_hash, config, tuple(numels.values())) is binary


def test_each_worker_job_s_times_are_kept(workers, triton_cache, tmp_path, monkeypatch):
    from kiln_triton import compile_pool

    kernel = compiled_kernel(_scale, [torch.randn(64, 48)], tmp_path, monkeypatch)
    numels = kernel.numels(())
    (job,) = kernel.compile_jobs(candidates(kernel.meta, numels)[0], numels, SM90)
    reply = workers.submit(job).result(timeout=300)
    times = compile_pool.job_times()[-1]
    assert times["function"] == job["function"] and times["options"] == job["options"]
    assert times["submitted"] <= times["started"] <= times["ended"]
    assert times["seconds"] == reply["seconds"] and not times["failed"]
    assert 0 <= times["launcher"] <= times["seconds"]


def _scale_job(workers, tmp_path, monkeypatch):
    """The first configuration of ``_scale``'s kernel as a job for sm_90, compiled by a
    worker, and its function."""
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path / "kiln"))
    kernel = compiled_kernel(_scale, [torch.randn(64, 48)], tmp_path, monkeypatch)
    numels = kernel.numels(())
    config = candidates(kernel.meta, numels)[0]
    (job,) = kernel.compile_jobs(config, numels, SM90)
    workers.submit(job).result(timeout=300)
    return job, getattr(kernel.module, config.variant)


def test_a_later_load_finds_the_binary_without_triton_s_cache_key(
    workers, triton_cache, tmp_path, monkeypatch
):
    """Triton's key hashes its own installation once per process (0.37 s here): a binary
    loaded before is found under the key its load remembered."""
    import triton.compiler.compiler as triton_compiler

    job, fn = _scale_job(workers, tmp_path, monkeypatch)
    first = precompiled.load(fn, job)  # found by Triton's key, which is remembered
    assert list((tmp_path / "kiln" / "binaries").glob("*.json"))

    def no_key(*args, **kwargs):
        raise AssertionError("Triton's cache key was computed")

    monkeypatch.setattr(triton_compiler, "get_cache_key", no_key)
    # nor the function's own key, which walks its syntax tree: the kernel module's name
    # holds its source's hash
    monkeypatch.setattr(type(fn), "cache_key", property(no_key))
    made = count_compiles(monkeypatch)
    again = precompiled.load(fn, job)
    assert made == [] and again is not first
    assert again.hash == first.hash and again.asm["cubin"] == first.asm["cubin"]
    # the intermediate forms stay in their files: PTX is read where it is asked for
    assert "llir" not in again.asm and "ptx" not in again.asm
    assert ptx_params(again) == ptx_params(first) > 2


def test_a_worker_compiles_its_first_job_without_importing_torch(
    triton_cache, tmp_path, monkeypatch
):
    """torch takes seconds to import in a fresh interpreter (9 s a worker on a GPU
    machine's host, sixteen starting at once): a worker's job must not need it, nor what
    the cache's folders are worked out from."""
    import pickle

    from kiln_triton import compile_pool, compile_worker

    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path / "kiln"))
    kernel = compiled_kernel(_scale, [torch.randn(64, 48)], tmp_path, monkeypatch)
    numels = kernel.numels(())
    (job,) = kernel.compile_jobs(candidates(kernel.meta, numels)[0], numels, SM90)
    (tmp_path / "job.pickle").write_bytes(pickle.dumps(job))
    script = textwrap.dedent(f"""
        import pickle, runpy, sys
        worker = runpy.run_path({compile_worker.__file__!r})  # as a worker, without main()
        worker["_register_package"]()
        with open({str(tmp_path / "job.pickle")!r}, "rb") as f:
            reply = worker["compile_job"](pickle.load(f), {{}})
        print(reply["error"], "torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True,
                          env=compile_pool._worker_environment(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False"]
    assert list((tmp_path / "kiln" / "binaries").glob("*.json"))  # remembered where it says


def test_a_remembered_binary_loads_from_kiln_s_cache_alone(
    workers, triton_cache, tmp_path, monkeypatch
):
    """What loading and launching a binary read (metadata, binary, PTX) is kept beside its
    entry in Kiln's cache: Triton's cache cleared, it still loads, and clearing Kiln's
    cache clears it."""
    import shutil

    import triton

    job, fn = _scale_job(workers, tmp_path, monkeypatch)
    first = precompiled.load(fn, job)
    kept = tmp_path / "kiln" / "binaries" / first.hash
    assert {p.suffix for p in kept.iterdir()} == {".json", ".cubin", ".ptx"}
    shutil.rmtree(triton_cache)

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(triton, "compile", no_compile)
    again = precompiled.load(fn, job)
    assert again.hash == first.hash and again.asm["cubin"] == first.asm["cubin"]
    assert ptx_params(again) == ptx_params(first)


def test_a_binary_kept_by_neither_cache_goes_to_triton_and_one_in_triton_s_is_kept(
    workers, triton_cache, tmp_path, monkeypatch
):
    import shutil

    import triton

    job, fn = _scale_job(workers, tmp_path, monkeypatch)
    first = precompiled.load(fn, job)
    kept = tmp_path / "kiln" / "binaries" / first.hash
    shutil.rmtree(kept)  # as an entry remembered before binaries were kept
    assert precompiled.load(fn, job).hash == first.hash  # from Triton's cache
    assert kept.is_dir(), "the binary found in Triton's cache was not kept"
    shutil.rmtree(kept)
    shutil.rmtree(triton_cache)  # the binary is gone; the remembered key is not
    asked, compiled = [], types.SimpleNamespace(hash="0" * 64)
    monkeypatch.setattr(triton, "compile", lambda source, **kw: asked.append(source) or compiled)
    assert precompiled.load(fn, job) is compiled and len(asked) == 1


def test_a_graph_s_launch_configurations_compile_in_workers(
    workers, triton_cache, tmp_path, monkeypatch
):
    kernel = compiled_kernel(_scale, [torch.randn(3, 1000)], tmp_path, monkeypatch)
    jobs = [(kernel, c, kernel.numels(())) for c in candidates(kernel.meta, kernel.numels(()))]
    made = count_compiles(monkeypatch)
    compiled, failures = codegen.compile_in_workers(jobs, workers, SM90)
    assert (compiled, failures, made) == (len(jobs), [], [])
    for _, config, numels in jobs:  # 3000 elements: not a multiple of 16
        (job,) = kernel.compile_jobs(config, numels, SM90)
        assert job["attrs"][(2,)] == []
        assert precompiled.binary(kernel.source_hash, config, (3000,)) is not None
    assert codegen.planned_jobs([kernel]) == []  # compiled already: nothing left to do


def test_a_kernel_is_handed_to_the_workers_as_it_renders(
    workers, triton_cache, tmp_path, monkeypatch
):
    """Its launch configurations build while the graph's other kernels render; the graph's
    build waits for them instead of handing them over again, and counts the kernel once."""
    (kernel,) = compile_fn(_scale, [torch.randn(3, 1000)], codegen="reference").schedule.kernels()
    submitted = []
    submit = workers.submit
    monkeypatch.setattr(workers, "submit", lambda job: submitted.append(job) or submit(job))
    monkeypatch.setattr(codegen, "compiles_for_gpu", lambda: True)
    monkeypatch.setattr(codegen, "compile_workers", lambda: workers)
    monkeypatch.setattr(precompiled, "current_target", lambda: SM90)
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path / "kiln"))  # new to the cache
    monkeypatch.setattr(codegen, "_FOUND_ON_DISK", set())
    monkeypatch.setattr(precompiled, "_BINARIES", {})  # none loaded by the tests before
    for table in ("_MODULES", "_UNCOUNTED", "_KERNEL_COUNTS"):  # this test's kernels only
        monkeypatch.setattr(codegen, table, {"built": 0, "reused": 0} if "COUNTS" in table else {})
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # compiled @triton.jit functions, as on a GPU
    source = TritonCodegen().render(kernel)
    handed = len(submitted)
    assert handed >= 1 and codegen.kernel_counts() == {"built": 0, "reused": 0}
    module, digest = codegen.load_module(source)
    launcher = TritonKernel(module, digest, kernel.name)
    jobs = codegen.planned_jobs([launcher])
    assert len(jobs) == handed
    made = count_compiles(monkeypatch)
    assert codegen.compile_in_workers(jobs, workers, SM90) == (handed, [])
    assert (made, len(submitted), codegen._IN_FLIGHT) == ([], handed, {})
    assert codegen.planned_jobs([launcher]) == []  # loaded: nothing left to build
    assert codegen.kernel_counts() == {"built": 1, "reused": 0}
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _column_sum(x):
    return x.sum(0)


def test_a_split_reduction_compiles_both_its_kernels_in_workers(
    workers, triton_cache, tmp_path, monkeypatch
):
    """A split reduction is two kernels (its chunks', its finish) and a workspace; they
    compiled one after the other in this process at the first launch (58 of them, 72 s of
    ResNet-50's training compile on an H200's host)."""
    kernel = compiled_kernel(_column_sum, [torch.randn(40000, 8)], tmp_path, monkeypatch)
    numels = kernel.numels(())
    splits = [c for c in candidates(kernel.meta, numels) if c.variant.endswith("_split")]
    assert splits, "a column sum over 40000 rows is split"
    first, finish = kernel.compile_jobs(splits[0], numels, SM90)
    assert first["function"].endswith("_split") and finish["function"].endswith("_finish")
    n = len(kernel.meta["args"]) + len(numels)  # the workspace follows the numels
    assert first["signature"][kernel.module.__dict__[first["function"]].arg_names[n]] == "*fp32"
    made = count_compiles(monkeypatch)
    jobs = [(kernel, splits[0], numels)]
    assert codegen.compile_in_workers(jobs, workers, SM90) == (1, [])
    assert made == [], "this process compiled a split reduction's kernel"
    pair = precompiled.binary(kernel.source_hash, splits[0], tuple(numels.values()))
    loaded = [precompiled.load(getattr(kernel.module, j["function"]), j) for j in (first, finish)]
    assert [k.hash for k in pair] == [k.hash for k in loaded]  # the workers' binaries
    assert all("cubin" in k.asm for k in pair)


def test_kernels_calling_kiln_s_device_functions_are_found_in_the_cache_too(tmp_path):
    """A softmax calls ``kt.max_combine`` (device.py, which the worker imports without the
    package's ``__init__``): its cache key must still be the parent's. Run in a process
    of its own, where device.py is compiled rather than interpreted."""
    script = textwrap.dedent(
        """
        import torch
        from triton.compiler import ASTSource
        from kiln_loopir.testing import compile_fn
        from kiln_triton import TritonCodegen, codegen
        from kiln_triton.compile_pool import CompileWorkers
        from kiln_triton.configs import candidates
        from kiln_triton.launcher import TritonKernel

        graph = compile_fn(lambda x: x.softmax(-1), [torch.randn(8, 40)], codegen="reference")
        source = TritonCodegen(parallel_compile=False).render(graph.schedule.kernels()[0])
        assert "kt.max_combine" in source
        kernel = TritonKernel(*codegen.load_module(source), "softmax")
        numels = kernel.numels(())
        jobs = [(kernel, c, numels) for c in candidates(kernel.meta, numels)[:1]]
        made = []
        make_ir = ASTSource.make_ir
        ASTSource.make_ir = lambda self, *a, **k: made.append(self.name) or make_ir(self, *a, **k)
        pool = CompileWorkers(1)
        print(codegen.compile_in_workers(jobs, pool, ("cuda", 90, 32)), made)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "KILN_TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(1,", "[])", "[]"], done.stdout  # compiled, none here


def test_a_kernel_that_fails_to_compile_reports_why_and_compiles_at_its_launch(
    workers, triton_cache, tmp_path, monkeypatch
):
    def broken(source: str) -> str:  # a block that is not a power of 2 does not compile
        return source.replace("tl.arange(0, XBLOCK)", "tl.arange(0, 3)")

    kernel = compiled_kernel(_scale, [torch.randn(8, 8)], tmp_path, monkeypatch, broken)
    numels = kernel.numels(())
    config = candidates(kernel.meta, numels)[0]
    compiled, failures = codegen.compile_in_workers([(kernel, config, numels)], workers, SM90)
    assert compiled == 0
    (failure,) = failures
    assert "CompileWorkerError" in failure and "power of 2" in failure, failure
    assert precompiled.binary(kernel.source_hash, config, (64,)) is None  # Triton's launcher


def test_a_kernel_kiln_cannot_specialize_is_left_to_its_launch(workers, tmp_path, monkeypatch):
    kernel = compiled_kernel(_scale, [torch.randn(8, 8)], tmp_path, monkeypatch)
    kernel.meta = {**kernel.meta, "dtypes": ["complex64", "complex64"]}
    numels = kernel.numels(())
    config = candidates(kernel.meta, numels)[0]
    compiled, failures = codegen.compile_in_workers([(kernel, config, numels)], workers, SM90)
    assert compiled == 0 and "no Triton pointer type for complex64" in failures[0]


def test_a_worker_that_dies_fails_its_job_and_starts_again(workers, tmp_path):
    dies = tmp_path / "dies.py"
    dies.write_text("import os\nos._exit(3)\n")
    job = {"path": str(dies), "module": "dies", "function": "f", "cache_dir": str(tmp_path)}
    with pytest.raises(CompileWorkerError, match=r"exited \(3\)"):
        workers.submit(job).result(timeout=60)
    missing = {**job, "path": str(tmp_path / "missing.py")}
    with pytest.raises(CompileWorkerError, match="missing.py"):  # a new worker answers
        workers.submit(missing).result(timeout=60)


def test_workers_that_cannot_start_leave_the_compiles_to_this_process(tmp_path, monkeypatch):
    import types

    from kiln_triton import compile_pool

    script = tmp_path / "exits.py"
    script.write_text("raise SystemExit(5)\n")
    monkeypatch.setattr(compile_pool, "compile_worker", types.SimpleNamespace(__file__=script))
    pool = CompileWorkers(1)
    for _ in range(compile_pool.START_ATTEMPTS):
        with pytest.raises(CompileWorkerError, match=r"exited \(5\)"):
            pool.submit({}).result(timeout=60)
    assert pool.broken  # compile_workers() is None for it: threads compile
    with pytest.raises(CompileWorkerError, match="exits as it starts"):
        pool.submit({}).result(timeout=60)
    pool.shutdown()


def test_shutdown_stops_the_workers_and_fails_what_is_queued(tmp_path):
    pool = CompileWorkers(2)
    processes = [w.process for w in pool._workers]
    pool.shutdown()
    assert all(p.poll() is not None for p in processes)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit({})


def test_the_workers_stop_when_the_process_exits(tmp_path):
    script = textwrap.dedent(
        """
        from kiln_triton.compile_pool import compile_workers
        print(*compile_workers().pids(), flush=True)
        """
    )
    env = {**os.environ, "KILN_TRITON_COMPILE_WORKERS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_the_number_of_workers_comes_from_the_environment(monkeypatch):
    from kiln_triton.compile_pool import worker_count

    monkeypatch.setenv("KILN_TRITON_COMPILE_WORKERS", "3")
    assert worker_count() == 3
    monkeypatch.setenv("KILN_TRITON_COMPILE_WORKERS", "0")
    assert compile_workers() is None  # compiled in threads


def test_triton_s_key_of_its_installation_is_computed_in_a_thread():
    from triton.runtime.cache import triton_key

    from kiln_triton import known_binaries

    triton_key.cache_clear()
    known_binaries._key_thread = None
    codegen.TritonCodegen.prepare()
    thread = known_binaries._key_thread
    assert thread is not None and thread.name == "kiln-triton-key"
    thread.join(timeout=60)
    assert triton_key.cache_info().currsize == 1  # a compile now finds it computed
    codegen.TritonCodegen.prepare()
    assert known_binaries._key_thread is thread  # once per process


def test_the_gpu_target_is_read_after_the_driver_started_in_a_thread(monkeypatch):
    """``prepare()`` starts Triton's driver (with an empty Triton cache it first builds its
    C utilities) in a thread; the first compile's read of the target waits for that start
    rather than starting a second driver beside it."""
    import triton.runtime

    events = []

    def slow_start():
        time.sleep(0.2)
        events.append("driver started")

    def target():
        events.append("target read")
        return types.SimpleNamespace(backend="cuda", arch=90, warp_size=32)

    monkeypatch.setattr(precompiled, "_start_driver", slow_start)
    monkeypatch.setattr(precompiled, "_driver_start", None)
    monkeypatch.setattr(codegen, "compiles_for_gpu", lambda: True)
    codegen.TritonCodegen.prepare()
    thread = precompiled._driver_start
    assert thread is not None and thread.name == "kiln-triton-driver"
    fake_driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_target=target))
    monkeypatch.setattr(triton.runtime, "driver", fake_driver)
    precompiled.current_target.cache_clear()  # read once a process: this test's read only
    try:
        assert precompiled.current_target() == ("cuda", 90, 32)
    finally:
        precompiled.current_target.cache_clear()
    assert events == ["driver started", "target read"]
    codegen.TritonCodegen.prepare()
    assert precompiled._driver_start is thread  # once per process


def test_only_the_first_job_of_a_kernel_signature_builds_triton_s_launcher(
    triton_cache, tmp_path, monkeypatch
):
    """Triton's C launcher depends on the kernel's signature alone: one worker builds it,
    the jobs after it skip it, and the binary's key does not depend on which did."""
    import pickle

    from kiln_triton import compile_pool, compile_worker, known_binaries

    monkeypatch.setattr(codegen, "_SIGNATURES", set())
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path / "kiln"))
    kernel = compiled_kernel(_scale, [torch.randn(64, 48)], tmp_path, monkeypatch)
    numels = kernel.numels(())
    first, second = candidates(kernel.meta, numels)[:2]
    (one,) = kernel.compile_jobs(first, numels, SM90)
    (two,) = kernel.compile_jobs(second, numels, SM90)
    assert one["signature"] == two["signature"] and one["constexprs"] != two["constexprs"]
    assert codegen._first_of_its_signature(one) and not codegen._first_of_its_signature(two)

    jobs = [{**one, "launcher": True}, {**two, "launcher": False}]
    (tmp_path / "jobs.pickle").write_bytes(pickle.dumps(jobs))
    script = textwrap.dedent(f"""
        import pickle, runpy
        worker = runpy.run_path({compile_worker.__file__!r})  # as a worker, without main()
        worker["_register_package"]()
        built = []
        worker["compile_job"].__globals__["_build_launcher"] = lambda k: built.append(k.hash)
        with open({str(tmp_path / "jobs.pickle")!r}, "rb") as f:
            replies = [worker["compile_job"](job, {{}}) for job in pickle.load(f)]
        print([r["error"] for r in replies], built == [replies[0]["hash"]])
    """)
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True,
                          env=compile_pool._worker_environment(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("]")[-1].strip() == "True", done.stdout  # the second built none
    assert done.stdout.startswith("[None, None]"), done.stdout

    fn = getattr(kernel.module, first.variant)
    source = ASTSource(fn, one["signature"], one["constexprs"], one["attrs"])
    assert known_binaries.entry(source, jobs[0]) == known_binaries.entry(source, one)


@pytest.mark.parametrize("parallel", [True, False])
def test_the_workers_start_as_a_graph_starts_lowering(monkeypatch, parallel):
    started = []
    monkeypatch.setattr(codegen, "start_compile_workers", lambda: started.append(1))
    TritonCodegen(parallel_compile=parallel).begin_compile()
    assert started == ([1] if parallel else [])
