"""Logs (KILN_LOGS, kiln.set_logs), debug dumps (KILN_DEBUG), stage times and progress."""

import logging
import re
import time

import pytest
import torch
from helpers import Block

import kiln
from kiln import frames, logs


@pytest.fixture
def records():
    """Switch every log kind on and collect what they write."""
    collected: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record):
            collected.append(record)

    handler = Collect()
    kiln.set_logs("all")
    for kind in logs.KINDS:
        logs.logger(kind).addHandler(handler)
    yield collected
    for kind in logs.KINDS:
        logs.logger(kind).removeHandler(handler)
    logs.configure_from_environment()


def by_kind(records, kind):
    return [r.getMessage() for r in records if r.name == f"kiln.{kind}"]


def with_break(x):
    y = x.sin() * 2
    print("graph break here")  # noqa: T201
    return y.cos() + 1


def test_set_logs_switches_kinds():
    kiln.set_logs("graph,perf")
    try:
        assert logs.enabled("graph") and logs.enabled("perf")
        assert not logs.enabled("guards") and not logs.enabled("progress")
        kiln.set_logs(guards=True)
        assert logs.enabled("guards") and not logs.enabled("graph")
        with pytest.raises(ValueError, match=r"unknown Kiln log kind\(s\) \['grpah'\]"):
            kiln.set_logs("grpah")
    finally:
        logs.configure_from_environment()


def test_every_kind_logs_what_it_names(records):
    model = Block()
    compiled = kiln.compile(model, options={"cache": False})
    compiled(torch.randn(4, 16)).sum().backward()
    compiled(torch.randn(6, 16))  # another size: a recompile
    graph = by_kind(records, "graph")
    assert any("captured graph" in m for m in graph)
    assert any("forward aten graph" in m and "torch.ops.aten" in m for m in graph)
    assert any("backward aten graph" in m for m in graph)
    assert any("def guard(" in m for m in by_kind(records, "guards"))
    assert any("Block.forward" in m and "guard failed" in m for m in by_kind(records, "recompiles"))
    assert any("after fusion" in m for m in by_kind(records, "schedule"))
    output_code = by_kind(records, "output_code")
    assert any('extern "C"' in m and "def call(" in m for m in output_code)
    perf = by_kind(records, "perf")
    assert any("frame000 (Block.forward) compiled" in m and "loopir" in m for m in perf)
    assert any("backward compiled" in m and "build" in m for m in perf)


def test_graph_breaks_are_logged(records, capsys):
    kiln.compile(with_break, backend="eager")(torch.randn(3))
    breaks = by_kind(records, "graph_breaks")
    assert any("graph break" in m and "with_break" in m for m in breaks)


def test_debug_dump_writes_every_stage_with_fixed_names(tmp_path):
    model = Block()
    # a cache of its own: a graph found in the session's cache is dumped as loaded
    options = {"debug_dir": str(tmp_path / "dump"), "cache_dir": str(tmp_path / "cache")}
    compiled = kiln.compile(model, options=options)
    compiled(torch.randn(4, 16)).sum().backward()
    frame = tmp_path / "dump" / "frame000"
    expected = {
        "function.txt",
        "captured_graph.py",
        "guards.py",
        *(
            f"{kind}_{stage}"
            for kind in ("forward", "backward")
            for stage in (
                "aten.py",
                "loopir.txt",
                "loopir_fused.txt",
                "kernels.cpp",
                "host.py",
                "host.cpp",  # the native host program
            )
        ),
    }
    assert {p.name for p in frame.iterdir()} == expected
    assert (frame / "function.txt").read_text().startswith("Block.forward\n")
    assert "def guard(" in (frame / "guards.py").read_text()
    assert "torch.ops.aten" in (frame / "forward_aten.py").read_text()
    assert "Reduction" in (frame / "forward_loopir.txt").read_text()
    # kernels are named for their ops, the same in the schedule, the sources and the host
    kernels = (frame / "forward_kernels.cpp").read_text()
    names = re.findall(r'extern "C" int (kiln_\w+_\d+)\(', kernels)
    assert names and len(set(names)) == len(names)
    for name in names:
        assert f"{name}: ranges=" in (frame / "forward_loopir_fused.txt").read_text()
        host = (frame / "forward_host.py").read_text()
        assert f"{name}(" in host or f"status = {name}(" in kernels  # alone or in a group
    assert "def call(" in (frame / "backward_host.py").read_text()
    native = (frame / "forward_host.cpp").read_text()
    assert 'extern "C" int kiln_host_call(' in native
    assert all(f"{name}(" in native for name in names)  # kernels called directly


def test_debug_dump_has_one_folder_per_frame_and_replaces_old_runs(tmp_path):
    (tmp_path / "frame007").mkdir()  # left by an earlier run
    (tmp_path / "notes.txt").write_text("the user's own file")
    kiln.compile(with_break, options={"debug_dir": str(tmp_path)})(torch.randn(3))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["frame000", "frame001", "notes.txt"]
    assert (tmp_path / "frame000" / "graph_break.txt").exists()
    assert (tmp_path / "frame001" / "function.txt").read_text().startswith("with_break_resume")


def test_kiln_debug_and_kiln_logs_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_LOGS", "graph,perf")
    logs.configure_from_environment()  # what importing kiln does
    try:
        assert logs.enabled("graph") and logs.enabled("perf") and logs.enabled("progress")
        assert not logs.enabled("guards")
    finally:
        monkeypatch.delenv("KILN_LOGS")
        logs.configure_from_environment()
    monkeypatch.setenv("KILN_DEBUG", str(tmp_path / "dump"))
    kiln.compile(lambda x: (x.sin() + 1).sum(-1))(torch.randn(4, 8))
    assert (tmp_path / "dump" / "frame000" / "forward_kernels.cpp").exists()


def test_stage_times_and_progress(records, monkeypatch):
    monkeypatch.setattr(frames, "PROGRESS_AFTER_S", 0.0)
    kiln.compile(Block(), options={"cache": False})(torch.randn(4, 16))
    times = kiln.compile_times()
    stages = {"capture", "autograd", "lowering", "fusion", "memory", "loopir", "render", "build"}
    assert stages <= set(times)
    assert all(t >= 0 for t in times.values())
    progress = by_kind(records, "progress")
    assert any("lowering and scheduling" in m for m in progress)
    assert any("building" in m and "kernels with cpp" in m for m in progress)
    # every stage said to start says when it ended
    started = [m for m in progress if ": done in " not in m]
    assert all(any(m.startswith(s + ": done in ") for m in progress) for s in started)


def test_the_compile_timeline_holds_each_stage_by_thread_and_frame():
    kiln.reset()
    block = Block()
    out = kiln.compile(block, options={"cache": False})(torch.randn(4, 16))
    returned = time.perf_counter()  # the timeline's clock
    out.sum().backward()
    timeline = kiln.compile_timeline()
    stages = {(e["frame"], e["stage"]) for e in timeline}
    assert {("frame000", "autograd"), ("frame000", "lowering"), ("frame000", "build")} <= stages
    assert all(e["start"] <= e["end"] for e in timeline)
    assert [e["end"] for e in timeline] == sorted(e["end"] for e in timeline)
    # the backward compiled ahead, in a thread of its own, started inside the forward's
    # autograd; the frame waits for it before the first call returns (its build may end
    # after the forward's, which is built meanwhile)
    backward = [e for e in timeline if e["what"].startswith("backward:")]
    autograd = next(e for e in timeline if e["stage"] == "autograd")
    assert backward and {e["thread"] for e in backward} == {"kiln backward compile"}
    assert autograd["start"] <= min(e["start"] for e in backward) <= autograd["end"]
    assert all(e["end"] <= returned for e in backward)
    kiln.reset()
    assert kiln.compile_timeline() == []


def test_progress_says_what_happens_on_a_hit_and_counts_right(records, monkeypatch, tmp_path):
    monkeypatch.setattr(frames, "PROGRESS_AFTER_S", 0.0)
    options = {"cache_dir": str(tmp_path / "cache")}
    kiln.compile(lambda x: x.sin() + 1, options=options)(torch.randn(8))  # one kernel
    first = by_kind(records, "progress")
    assert any("building 1 kernel with cpp" in m for m in first), first
    records.clear()
    kiln.reset()  # a new process would find the graph in the cache
    kiln.compile(lambda x: x.sin() + 1, options=options)(torch.randn(8))
    second = by_kind(records, "progress")
    assert any("loading 1 kernel with cpp" in m for m in second), second
    assert not any("building" in m or "lowering" in m for m in second), second
    assert not any("1 kernels" in m for m in first + second)


def test_nested_stages_are_counted_once(monkeypatch):
    # the frame is made, outer opens, inner opens, inner ends, outer ends
    clock = iter([0.0, 0.0, 1.0, 3.0, 6.0])
    monkeypatch.setattr(frames.time, "perf_counter", lambda: next(clock))
    frame = frames.Frame(debug_dir=None)
    with frame.stage("outer"), frame.stage("inner"):
        pass
    assert dict(frame.times) == {"outer": 4.0, "inner": 2.0}
    assert kiln.compile_times() == {"outer": 4.0, "inner": 2.0}


def test_waiting_for_another_thread_s_compile_is_charged_to_no_stage(monkeypatch):
    # a training step's forward waits inside its autograd stage for the backward's first
    # turn, which times its own stages: the frame is made, autograd opens, the wait
    # begins (twice read), ends (twice read), autograd ends
    clock = iter([0.0, 0.0, 1.0, 1.0, 5.0, 5.0, 6.0])
    monkeypatch.setattr(frames.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(frames, "perf_counter", lambda: next(clock))
    frame = frames.Frame(debug_dir=None)
    before = frames._not_capture()
    with frame.stage("autograd"), frame.waiting():
        pass
    assert dict(frame.times) == {"autograd": 2.0}
    assert frames._not_capture() - before == 6.0  # nor to capture: staged or waited


def test_kiln_logs_takes_plus_and_minus_and_warns_of_unknown_kinds(monkeypatch):
    monkeypatch.setenv("KILN_LOGS", "+recompiles,-progress,recompile")
    try:
        with pytest.warns(RuntimeWarning, match=r"unknown Kiln log kind\(s\) \['recompile'\]"):
            logs.configure_from_environment()  # what importing kiln does: no error
        assert logs.enabled("recompiles") and not logs.enabled("progress")
        kiln.set_logs("all,-progress")
        assert logs.enabled("guards") and not logs.enabled("progress")
        with pytest.raises(ValueError, match="known:"):
            kiln.set_logs("-perff")
    finally:
        monkeypatch.delenv("KILN_LOGS")
        logs.configure_from_environment()


def test_kiln_debug_1_writes_to_a_default_folder_said_once(tmp_path, monkeypatch, capsys):
    from kiln import config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config, "_default_debug_dir", None)
    monkeypatch.setenv("KILN_DEBUG", "1")
    kiln.compile(lambda x: (x.cos() * 2).sum(-1))(torch.randn(4, 8))
    kiln.compile(lambda x: x.sin() + 1)(torch.randn(4, 8))
    said = [line for line in capsys.readouterr().err.splitlines() if "KILN_DEBUG=1" in line]
    assert len(said) == 1
    (run,) = (tmp_path / "kiln_debug").iterdir()
    assert run.name.startswith("run_") and said[0].endswith(str(run))
    assert (run / "frame000" / "forward_kernels.cpp").exists()
    assert not (tmp_path / "1").exists()
    monkeypatch.setenv("KILN_DEBUG", "0")
    assert config.debug_dir_from_environment() is None
