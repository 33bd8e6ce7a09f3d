"""The benchmarks' measuring helpers, on the CPU: turn-taking timing, the profiler sums of
the GPU benchmark (on a CPU profile and on made-up device events), its tables and case
selection, and the check that Kiln compiled."""

from __future__ import annotations

import pathlib
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(pathlib.Path(__file__).parent / "benchmarks"))
import bench_compile  # noqa: E402
import bench_gpu_calls  # noqa: E402
import gpu_models  # noqa: E402
import gpu_timing  # noqa: E402
import kiln_checks  # noqa: E402
import stack_samples  # noqa: E402
import timing  # noqa: E402


def test_take_turns_gives_a_median_per_variant():
    calls = {"a": 0, "b": 0}

    def bump(name):
        calls[name] += 1

    got = timing.take_turns(
        {"a": lambda: bump("a"), "b": lambda: bump("b")}, repeats=3, target_s=1e-4, most_calls=5
    )
    assert set(got) == {"a", "b"} and all(0 < s < 0.01 for s in got.values())
    assert calls["a"] >= 3 + 3 and calls["b"] >= 3 + 3  # calibration, then 3 repeats


def test_a_compile_timeline_merges_stages_and_worker_jobs_from_the_call_s_start():
    import kiln

    kiln.reset()
    started = time.perf_counter()
    kiln.compile(lambda x: x.sin() + 1, options={"cache": False})(torch.randn(8))
    events = bench_compile.timeline(started)
    assert events == sorted(events) and all(0 <= s <= e for s, e, _, _ in events)
    assert any(what.startswith("frame000 lowering") for _, _, _, what in events)
    text = bench_compile.timeline_text("f inference kiln, cold", events, least=0.0)
    assert text.splitlines()[0].startswith("f inference kiln, cold: start, end, seconds")
    assert len(text.splitlines()) == len(events) + 1
    shorter = bench_compile.timeline_text("x", events, least=1e9)
    assert len(shorter.splitlines()) == 1  # none takes that long


def test_sampled_stacks_are_summed_per_window_of_the_timeline():
    outer, lower, fuse = ("bench.py:measure",), "kiln_loopir/lowering/__init__.py:lower", "f:fuse"
    samples = [(10.0 + t, "MainThread", stack) for t, stack in [
        (0.05, ("capture.py:trace", *outer)),
        (0.2, (lower, *outer)), (0.3, (lower, *outer)), (0.4, ("g:x", fuse, *outer)),
        (0.9, ("run.py:call", *outer)),
    ]] + [(10.3, "kiln backward compile", (fuse,))]  # fmt: skip
    events = [[0.1, 0.5, "MainThread", "frame000 lowering"],
              [0.2, 0.6, "compile worker", "kernel (worker 0.4 s)"]]  # fmt: skip
    text = stack_samples.profile_text(samples, events, started=10.0, least=0.1)
    lines = text.splitlines()
    assert lines[0].endswith("MainThread  before the first stage: 1 samples")
    window = lines.index("   0.100    0.500  MainThread  frame000 lowering: 3 samples")
    assert lines[window + 1] == f"   66.7%  {lower}"  # the enclosing measure is left out
    assert f"   33.3%  {fuse}" in lines and "   33.3%  g:x  (innermost)" in lines
    assert not any("worker" in line for line in lines)  # the workers' jobs have no stacks
    assert lines[-2].endswith("after the last stage: 1 samples")
    assert lines[-1] == "  100.0%  run.py:call  (innermost)"


def test_threads_python_did_not_start_are_shown_beside_the_main_thread():
    engine = ("torch/autograd/graph.py:_engine_run_backward",)
    samples = [(10.7, "MainThread", engine), (10.7, "?", ("host.py:call", "fn.py:backward")),
               (10.3, "?", ("trace.py:backward",))]  # fmt: skip
    events = [[0.1, 0.5, "MainThread", "frame000 autograd"]]
    lines = stack_samples.profile_text(samples, events, started=10.0, least=0.1).splitlines()
    during = lines.index("   0.100    0.500  MainThread  frame000 autograd, threads Python did "
                         "not start: 1 samples")  # fmt: skip
    assert lines[during + 1] == "  100.0%  trace.py:backward  (innermost)"
    assert lines[-2].endswith("after the last stage, threads Python did not start: 1 samples")
    assert lines[-1] == "  100.0%  host.py:call  (innermost)"


def test_a_stack_sampler_sees_a_compile_s_stages():
    import kiln

    kiln.reset()
    sampler = stack_samples.StackSampler(interval=0.001).start()
    started = time.perf_counter()
    kiln.compile(lambda x: (x.sin() * x.cos()).sum(0) + 1, options={"cache": False})(
        torch.randn(64, 8)
    )
    samples = sampler.stop()
    assert any("kiln" in frame for _, _, stack in samples for frame in stack)
    text = stack_samples.profile_text(samples, bench_compile.timeline(started), started, 0.0)
    assert "frame000 lowering" in text and "before the first stage" in text


def test_markdown_table_aligns_numeric_columns():
    text = timing.markdown_table(["case", "µs", "note"], [["x", "1.0", "ok"]], numeric=1)
    assert text.splitlines() == ["| case | µs | note |", "| --- | ---: | --- |", "| x | 1.0 | ok |"]


def test_busy_time_counts_overlaps_once():
    assert gpu_timing.busy_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert gpu_timing.busy_us([]) == 0


def test_device_events_are_told_apart():
    assert gpu_timing.device_kind("Memcpy DtoD (Device -> Device)", None) == "memcpy"
    assert gpu_timing.device_kind("Memset (Device)", None) == "memset"
    assert gpu_timing.device_kind("triton_poi_fused_0", None) == "kernel"
    assert gpu_timing.device_kind("anything", "gpu_memset") == "memset"


def _event(name, device, start, end):
    return SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end)
    )


def test_summarize_counts_kernels_copies_and_launches_per_call():
    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    events = [
        _event("cudaLaunchKernel", cpu, 0, 1),
        _event("cuLaunchKernelEx", cpu, 1, 2),
        _event("cudaMemcpyAsync", cpu, 2, 3),
        _event("cudaGraphLaunch", cpu, 3, 4),
        _event("aten::mm", cpu, 0, 4),
        _event("gemm_kernel", cuda, 10, 20),
        _event("triton_poi_fused_0", cuda, 20, 24),
        _event("Memcpy DtoD (Device -> Device)", cuda, 30, 32),
    ]
    p = gpu_timing.summarize(events, calls=2)
    assert (p.kernels, p.copies) == (1.0, 0.5)
    assert p.busy_us == 8.0 and p.kernel_us == 7.0
    assert (p.kernel_launch_calls, p.graph_launches, p.copy_calls) == (1.0, 0.5, 0.5)
    assert p.host_launch_calls == 2.0
    assert gpu_timing.graphs_replaying(p) is not None  # half a graph launch per call
    assert gpu_timing.graphs_replaying(gpu_timing.summarize(events, calls=1)) is None


def test_summarize_reads_a_real_profile():
    """A CPU profile, read as if the CPU were the device: one event per op per call."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            torch.relu(x)
    p = gpu_timing.summarize(prof.events(), calls=4, device_type=DeviceType.CPU)
    relus = [e for e in prof.events() if e.name == "aten::relu"]
    assert len(relus) == 4 and p.kernels >= 1 and p.busy_us > 0
    assert p.kernel_launch_calls == 0 and p.graph_launches == 0


def test_kiln_replay_delta():
    before = (10, 0, {})
    assert gpu_timing.kiln_replay_delta(before, (14, 0, {})) == (4, 0, "")
    replays, eager, why = gpu_timing.kiln_replay_delta(before, (10, 2, {"host sync": 2}))
    assert (replays, eager) == (0, 2) and "host sync (2x)" in why
    assert gpu_timing.kiln_replay_delta(None, None)[2] == "kiln_cudagraphs is not importable"


def test_gpu_table_rows():
    head = {"model": "bert", "input": "8x128", "phase": "inference", "mode": "kiln"}
    prof = {"busy_us": 500.0, "kernels": 64.0, "copies": 1.0, "host_launch_calls": 70.0}
    row = bench_gpu_calls.format_row({**head, "wall_us": 1000.0, "profile": prof, "note": "ok"})
    assert row[4:] == ["1000", "500", "2.00", "64.0", "1.0", "70.0", "ok"]
    off = bench_gpu_calls.format_row({**head, "note": "not engaged: no cudaGraphLaunch"})
    assert off[4:] == [""] * 6 + ["not engaged: no cudaGraphLaunch"]
    assert len(bench_gpu_calls.table([{**head, "note": "x"}]).splitlines()) == 3


def test_gpu_cases_follow_the_environment(monkeypatch):
    monkeypatch.setenv("KILN_BENCH_MODELS", "vit,gpt")
    monkeypatch.setenv("KILN_BENCH_SIZES", "all")
    monkeypatch.setenv("KILN_BENCH_PHASES", "training")
    cases = bench_gpu_calls.planned_cases()
    assert cases == [
        ("gpt2", "serving", "training"),
        ("gpt2", "throughput", "training"),
        ("vit_base_patch16_224", "serving", "training"),
        ("vit_base_patch16_224", "throughput", "training"),
    ]
    monkeypatch.setenv("KILN_BENCH_MODELS", "bort")
    with pytest.raises(SystemExit, match="bort"):
        bench_gpu_calls.planned_cases()


def test_gpu_benchmark_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "needs a CUDA GPU" in bench_gpu_calls.main()
    monkeypatch.setenv("KILN_BENCH_DRY_RUN", "1")
    assert "bert serving inference" in bench_gpu_calls.main()


def test_read_debug_dir(tmp_path):
    (tmp_path / "frame000").mkdir()
    (tmp_path / "frame000" / "forward_host.py").write_text("")
    (tmp_path / "frame000" / "backward_host.py").write_text("")
    (tmp_path / "frame001").mkdir()
    (tmp_path / "frame001" / "graph_break.txt").write_text("")
    found = kiln_checks.read_debug_dir(tmp_path)
    assert (found.frames, found.host_programs, found.graph_breaks) == (2, 2, 1)
    assert found.describe() == "2 graph(s), 2 compiled, 1 graph break(s)"


def test_compile_checked_sees_the_compiled_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cpp"))
    x = torch.randn(4, 8)
    fn, found = kiln_checks.compile_checked(lambda a: (a * 2).relu() + 1, lambda f: f(x))
    assert found.frames == 1 and found.host_programs == 1
    torch.testing.assert_close(fn(x), (x * 2).relu() + 1)


def test_compile_checked_refuses_a_function_that_compiles_nothing():
    x = torch.randn(4)
    with pytest.raises(RuntimeError, match="kiln compiled no graph"):
        kiln_checks.compile_checked(lambda a: a, lambda f: f(x))


def test_compile_checked_refuses_a_function_that_runs_eagerly():
    x = torch.randn(4)
    with pytest.raises(RuntimeWarning, match="kiln-capture runs .* eagerly"):
        kiln_checks.compile_checked(lambda a: a.tolist(), lambda f: f(x))


def test_gpu_models_build_at_each_size():
    pytest.importorskip("transformers")
    model, inputs = gpu_models.build("bert", "throughput", device="cpu", dtype=torch.float32)
    assert gpu_models.describe_inputs(inputs) == "32x512"
    with torch.no_grad():
        out = model(inputs[0][:1, :8])
    assert out.shape == (1, 8, 768)
    assert not any(m.p for m in model.modules() if isinstance(m, torch.nn.Dropout))
