"""Native host programs built in the background (host_builds.py): the program runs its
fallback until the build is done, then its library. No GPU needed: a CPU graph's native
host program (kiln-cpp's) stands in for a CUDA one, and the build is kiln-cpp's cache
hit held back until the test lets it go."""

import copy
import logging
import threading
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln_cpp import CppCompileError, build
from kiln_loopir import compile_fx
from kiln_triton import host_builds, wait_for_host_builds


def _block(x, w):
    return (torch.relu(x @ w) * 2 + x.sum(1, keepdim=True),)


def _inputs():
    return [torch.randn(8, 16), torch.randn(16, 16) / 4]


@pytest.fixture
def cpu_graph():
    inputs = _inputs()
    gm = make_fx(_block)(*inputs)
    return compile_fx(gm, inputs, codegen="cpp", host_program="native")


def _held_build(monkeypatch, result):
    """kiln-cpp's build, seen by host_builds: nothing cached, and a build that returns
    ``result()`` once the returned event is set."""
    release = threading.Event()

    def held(*args, **kwargs):
        assert release.wait(30)
        return result(), True

    monkeypatch.delenv("KILN_TRITON_HOST_BUILD", raising=False)
    monkeypatch.setattr(build, "lookup", lambda *args, **kwargs: None)
    monkeypatch.setattr(build, "build", held)
    return release


def test_the_fallback_runs_the_calls_until_the_library_is_built(monkeypatch, cpu_graph):
    library = Path(cpu_graph.native_host.program.library._name)
    release = _held_build(monkeypatch, lambda: library)
    host = host_builds.load(copy.copy(cpu_graph.native_host))
    program = host.program
    ran = []

    def python(*inputs):
        ran.append(len(inputs))
        return cpu_graph.program.python_call(*inputs)

    program.set_fallback(python)
    x, w = _inputs()
    (before,) = program(x, w)
    assert not program.started and ran == [2], "the Python program ran the first call"
    release.set()
    wait_for_host_builds()
    assert program.started
    (after,) = program(x, w)
    assert ran == [2], "the library ran the call once built"
    want = _block(x, w)[0]
    torch.testing.assert_close(before, want)
    torch.testing.assert_close(after, want)


def test_a_failed_build_is_logged_and_leaves_the_python_program(monkeypatch, cpu_graph, caplog):
    def fails():
        raise CppCompileError("the compiler failed")

    release = _held_build(monkeypatch, fails)
    host = host_builds.load(copy.copy(cpu_graph.native_host))
    host.program.set_fallback(cpu_graph.program.python_call)
    release.set()
    with caplog.at_level(logging.WARNING, logger="kiln.triton"):
        wait_for_host_builds()
    assert not host.program.started
    assert "building the native one failed" in caplog.text
    x, w = _inputs()
    torch.testing.assert_close(host.program(x, w)[0], _block(x, w)[0])


def test_wait_builds_before_returning(monkeypatch, cpu_graph):
    library = Path(cpu_graph.native_host.program.library._name)
    release = _held_build(monkeypatch, lambda: library)
    release.set()
    monkeypatch.setenv("KILN_TRITON_HOST_BUILD", "wait")
    host = host_builds.load(copy.copy(cpu_graph.native_host))
    assert host.program.started
    x, w = _inputs()
    torch.testing.assert_close(host.program(x, w)[0], _block(x, w)[0])


def test_a_process_that_ends_during_a_build_finishes_it(tmp_path):
    """The next process finds the library: the build threads are joined at exit."""
    import subprocess
    import sys
    import textwrap

    done = tmp_path / "built"
    script = textwrap.dedent(f"""
        import time, types
        from kiln_cpp import build
        from kiln_triton import host_builds

        def slow_build(*args, **kwargs):
            time.sleep(1.0)
            open({str(done)!r}, "w").write("built")
            raise RuntimeError("no library: the test only needs the build to finish")

        build.lookup = lambda *args, **kwargs: None
        build.build = slow_build
        host_builds._start(types.SimpleNamespace(program=None), "source")
    """)  # the process ends at once, its build in flight
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert done.read_text() == "built"
