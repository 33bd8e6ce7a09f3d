"""The on-disk library cache, and the errors of the compiler driver."""

import pytest
import torch

from kiln_cpp import CppCodegen, CppCompileError, build
from kiln_loopir.testing import check_against_eager, compile_fn


def _fn(a, b):
    return torch.tanh(a) * b + 0.25


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path))
    return tmp_path


def _inputs():
    return [torch.randn(6, 5), torch.randn(6, 5)]


def test_second_compile_hits_the_cache(fresh_cache):
    first = CppCodegen()
    check_against_eager(_fn, _inputs(), codegen=first)
    assert (first.builds, first.cache_hits) == (1, 0)
    lib = first.last_library
    mtime = lib.stat().st_mtime_ns
    second = CppCodegen()
    check_against_eager(_fn, _inputs(), codegen=second)  # fresh inputs, same graph
    assert (second.builds, second.cache_hits) == (0, 1)
    assert second.last_library == lib and lib.stat().st_mtime_ns == mtime
    assert len([p for p in fresh_cache.iterdir() if p.is_dir()]) == 1  # one library entry


def test_corrupt_entry_is_rebuilt(fresh_cache):
    first = CppCodegen()
    compile_fn(_fn, _inputs(), codegen=first)
    lib = first.last_library
    # a new file in its place: truncating the mapped library would crash this process
    bad = lib.with_name("bad")
    bad.write_bytes(b"\x7fELF half written")
    bad.replace(lib)
    again = CppCodegen()
    check_against_eager(_fn, _inputs(), codegen=again)
    assert again.builds == 1 and again.cache_hits == 0
    assert build.cached_library(lib.parent) == lib


def test_missing_compiler_raises_the_documented_error(fresh_cache, monkeypatch):
    monkeypatch.setenv("KILN_CXX", "kiln-no-such-compiler")
    with pytest.raises(CppCompileError, match="no C\\+\\+ compiler.*KILN_CXX"):
        compile_fn(_fn, _inputs(), codegen=CppCodegen())


def test_compiler_failure_raises_with_its_output(fresh_cache):
    with pytest.raises(CppCompileError, match="failed"):
        CppCodegen().compile(['extern "C" int kiln_fill_0(float* a) { not c++ }'])
