"""What the compiler says about itself and this CPU (its version, what ``-march=native``
resolves to, which optional flags it takes) is asked once per compiler and CPU: later
processes read the answers from the library cache instead of running the compiler."""

import json
import os
import shutil
import stat
import subprocess

import pytest

import kiln_cpp
from kiln_cpp import build

_FACTS = (build._compiler_version, build.cpu_features, build.optional_flags)


def _new_process():
    """Forget what this process remembers, as a new process starts."""
    for fn in _FACTS:
        fn.cache_clear()


@pytest.fixture
def counting_compiler(tmp_path, monkeypatch):
    """g++ behind a script that logs each run, and the cache in a fresh folder."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    log = tmp_path / "runs.log"
    script = tmp_path / "counting-g++"
    script.write_text(f'#!/bin/sh\necho run >> {log}\nexec {cxx} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cache"))
    _new_process()
    yield str(script), log
    _new_process()


def _runs(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _records(folder, kind="*"):
    return sorted(folder.glob(f"{kind}-*.json"))


def _ask_all(cxx):
    return [fn(cxx) for fn in _FACTS]


def test_a_new_process_reads_the_answers_instead_of_running_the_compiler(
    counting_compiler, tmp_path, monkeypatch
):
    cxx, log = counting_compiler
    first = _ask_all(cxx)
    key = build.cache_key("int x;", cxx)
    runs = _runs(log)
    assert runs >= 1 + len(build.OPTIONAL_FLAGS)  # --version and the probes at least
    cache = tmp_path / "cache"
    assert [p.name.split("-")[0] for p in _records(cache)] == ["cpu", "probe", "version"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in _records(cache))
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700

    _new_process()

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"the compiler ran: {args}")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    monkeypatch.setattr(subprocess, "Popen", no_compiler)
    assert _ask_all(cxx) == first
    assert build.cache_key("int x;", cxx) == key  # the libraries built before still found
    assert _runs(log) == runs


def test_a_changed_compiler_is_asked_again(counting_compiler, tmp_path):
    cxx, log = counting_compiler
    first = _ask_all(cxx)
    runs = _runs(log)
    parts = build._compiler_file(cxx)
    with open(cxx, "a") as f:  # an upgraded compiler: another size and time
        f.write("# upgraded\n")
    os.utime(cxx, ns=(os.stat(cxx).st_atime_ns, os.stat(cxx).st_mtime_ns + 10**9))
    assert build._compiler_file(cxx) != parts
    _new_process()
    assert _ask_all(cxx) == first
    assert _runs(log) == 2 * runs
    assert len(_records(tmp_path / "cache")) == 6


def test_another_cpu_resolves_native_again(counting_compiler, tmp_path, monkeypatch):
    cxx, log = counting_compiler
    features = build.cpu_features(cxx)
    runs = _runs(log)
    monkeypatch.setattr(build, "_cpu_identity", lambda: "flags : another cpu")
    _new_process()
    assert build.cpu_features(cxx) == features  # the same CPU in fact: the same answer
    assert _runs(log) == runs + 1
    assert len(_records(tmp_path / "cache", "cpu")) == 2


def test_the_key_holds_kiln_cpps_version(monkeypatch):
    key = build.record_key(("a", "b"))
    monkeypatch.setattr(build, "__version__", kiln_cpp.__version__ + ".post1")
    assert build.record_key(("a", "b")) != key


@pytest.mark.parametrize("content", ["{not json", '{"value": [99]}', '{"value": "0"}', "[]"])
def test_a_probe_record_this_module_did_not_write_is_asked_again(
    counting_compiler, tmp_path, content
):
    cxx, log = counting_compiler
    expected = build.optional_flags(cxx)
    (record,) = _records(tmp_path / "cache", "probe")
    record.write_text(content)
    build.optional_flags.cache_clear()
    assert build.optional_flags(cxx) == expected  # never a flag the record names
    assert _runs(log) == 2 * len(build.OPTIONAL_FLAGS)
    assert isinstance(json.loads(record.read_text())["value"], list)  # written anew


def test_nothing_remembered_where_the_disk_cache_is_off(counting_compiler, tmp_path, monkeypatch):
    cxx, log = counting_compiler
    monkeypatch.delenv("KILN_CPP_CACHE_DIR")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "root"))
    with kiln_cpp.cache_root(None):
        _ask_all(cxx)
    assert _runs(log) >= 1 + len(build.OPTIONAL_FLAGS)
    assert not (tmp_path / "root").exists()
