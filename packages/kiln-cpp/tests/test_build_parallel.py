"""Builds of different graphs overlap; concurrent builds of one graph compile it once."""

import os
import shutil
import stat
import threading

import pytest
import torch

from kiln_cpp import CppCodegen, build


def _kernel(value: int) -> str:
    return f'extern "C" int kiln_fill_0(float* a) {{ a[0] = {value}.0f; return 0; }}\n'


@pytest.fixture
def logging_compiler(tmp_path, monkeypatch):
    """A compiler that records when each library build starts and ends (and takes at least
    half a second), passing everything else through to g++."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    log = tmp_path / "builds.log"
    script = tmp_path / "logging-g++"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  *kernels.cpp*) echo "start $(date +%s.%N)" >> {log}; sleep 0.5; {cxx} "$@"; '
        f'rc=$?; echo "end $(date +%s.%N)" >> {log}; exit $rc;;\n'
        "esac\n"
        f'exec {cxx} "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KILN_CXX", str(script))
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cache"))
    return log


def _intervals(log) -> list[tuple[float, float]]:
    starts, ends = [], []
    for line in log.read_text().splitlines():
        kind, when = line.split()
        (starts if kind == "start" else ends).append(float(when))
    return list(zip(sorted(starts), sorted(ends), strict=True))


def _run_in_threads(targets) -> list:
    results = [None] * len(targets)

    def run(i):
        results[i] = targets[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_builds_of_different_graphs_overlap(logging_compiler):
    codegens = [CppCodegen(), CppCodegen()]
    kernels = _run_in_threads([lambda i=i: codegens[i].compile([_kernel(i)]) for i in range(2)])
    assert [c.builds for c in codegens] == [1, 1]
    (s1, e1), (s2, e2) = _intervals(logging_compiler)
    assert s2 < e1 and s1 < e2, "the two builds ran one after the other"
    for i, (kernel,) in enumerate(kernels):
        out = torch.zeros(1)
        kernel(out)
        assert out.item() == i


def test_concurrent_builds_of_one_graph_compile_it_once(logging_compiler):
    codegens = [CppCodegen() for _ in range(4)]
    _run_in_threads([lambda c=c: c.compile([_kernel(7)]) for c in codegens])
    assert len(_intervals(logging_compiler)) == 1
    assert sum(c.builds for c in codegens) == 1
    assert sum(c.cache_hits for c in codegens) == 3
    assert len({c.last_library for c in codegens}) == 1


def test_build_async_returns_the_library(logging_compiler):
    futures = [build.build_async(_kernel(i)) for i in (3, 4)]
    paths = [f.result()[0] for f in futures]
    assert all(os.path.exists(p) for p in paths) and paths[0] != paths[1]


def test_the_cache_key_holds_the_cpu_features(monkeypatch):
    cxx = build.compiler()
    assert build.cpu_features(cxx).strip()
    key = build.cache_key(_kernel(1), cxx)
    monkeypatch.setattr(build, "cpu_features", lambda path: "another cpu")
    assert build.cache_key(_kernel(1), cxx) != key


def test_a_host_program_built_at_other_flags_is_another_library(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path))
    host = 'extern "C" int kiln_probe_host(int x) { return x + 1; }\n'
    cxx = build.compiler()
    assert build.cache_key([], cxx, host) != build.cache_key([], cxx, host, build.LAUNCH_HOST_FLAGS)
    optimised, built = build.build([], host=host)
    plain, built_too = build.build([], host=host, host_flags=build.LAUNCH_HOST_FLAGS)
    assert built and built_too and optimised != plain
    for path in (optimised, plain):
        assert build.load(path).kiln_probe_host(41) == 42
