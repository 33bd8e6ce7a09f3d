"""The compiler probe (which optional flags it takes) runs once per compiler: later
processes read its answer from the library cache instead of running the compiler."""

import json
import os
import shutil
import stat
import subprocess

import pytest

import kiln_cpp
from kiln_cpp import build


@pytest.fixture
def counting_compiler(tmp_path, monkeypatch):
    """g++ behind a script that logs each run; the cache in a fresh folder; the
    in-process memo of the probe forgotten before and after (a new process)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    log = tmp_path / "runs.log"
    script = tmp_path / "counting-g++"
    script.write_text(f'#!/bin/sh\necho run >> {log}\nexec {cxx} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cache"))
    build.optional_flags.cache_clear()
    yield str(script), log
    build.optional_flags.cache_clear()


def _runs(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _records(folder):
    return sorted(folder.glob("probe-*.json"))


def test_a_fresh_process_reads_the_probe_instead_of_running_the_compiler(
    counting_compiler, tmp_path, monkeypatch
):
    cxx, log = counting_compiler
    first = build.optional_flags(cxx)
    assert _runs(log) == len(build.OPTIONAL_FLAGS)
    (record,) = _records(tmp_path / "cache")
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700

    build.optional_flags.cache_clear()  # what a new process starts with

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"the compiler ran: {args}")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    monkeypatch.setattr(subprocess, "Popen", no_compiler)
    assert build.optional_flags(cxx) == first
    assert _runs(log) == len(build.OPTIONAL_FLAGS)


def test_a_changed_compiler_is_probed_again(counting_compiler, tmp_path):
    cxx, log = counting_compiler
    first = build.optional_flags(cxx)
    key = build.probe_key(cxx)
    with open(cxx, "a") as f:  # an upgraded compiler: another size and time
        f.write("# upgraded\n")
    os.utime(cxx, ns=(os.stat(cxx).st_atime_ns, os.stat(cxx).st_mtime_ns + 10**9))
    assert build.probe_key(cxx) != key
    build.optional_flags.cache_clear()
    assert build.optional_flags(cxx) == first
    assert _runs(log) == 2 * len(build.OPTIONAL_FLAGS)
    assert len(_records(tmp_path / "cache")) == 2


def test_the_key_holds_kiln_cpps_version(counting_compiler, monkeypatch):
    cxx, _ = counting_compiler
    key = build.probe_key(cxx)
    monkeypatch.setattr(build, "__version__", kiln_cpp.__version__ + ".post1")
    assert build.probe_key(cxx) != key


@pytest.mark.parametrize("content", ["{not json", '{"accepted": [99]}', '{"accepted": "0"}'])
def test_a_record_this_module_did_not_write_is_probed_again(counting_compiler, tmp_path, content):
    cxx, log = counting_compiler
    expected = build.optional_flags(cxx)
    (record,) = _records(tmp_path / "cache")
    record.write_text(content)
    build.optional_flags.cache_clear()
    assert build.optional_flags(cxx) == expected
    assert _runs(log) == 2 * len(build.OPTIONAL_FLAGS)
    assert isinstance(json.loads(record.read_text())["accepted"], list)  # written anew


def test_no_record_where_the_disk_cache_is_off(counting_compiler, tmp_path, monkeypatch):
    cxx, log = counting_compiler
    monkeypatch.delenv("KILN_CPP_CACHE_DIR")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "root"))
    with kiln_cpp.cache_root(None):
        build.optional_flags(cxx)
    assert _runs(log) == len(build.OPTIONAL_FLAGS)
    assert not (tmp_path / "root").exists()
