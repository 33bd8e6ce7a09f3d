"""Where the library cache lies (its own variable, the root, KILN_CACHE_DIR) and the check
that keeps it private: folders made 0o700, a folder others can write to refused."""

import stat
import warnings

import pytest
import torch

import kiln_cpp
from kiln_cpp import CppCodegen, cache_dirs
from kiln_loopir.cache_folders import forget_refusals
from kiln_loopir.testing import check_against_eager


def _fn(a, b):
    return torch.sin(a) - b * 3.0


def _inputs():
    return [torch.randn(5, 7), torch.randn(5, 7)]


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def no_own_variable(monkeypatch):
    monkeypatch.delenv("KILN_CPP_CACHE_DIR", raising=False)
    forget_refusals()


def test_libraries_lie_under_kiln_cache_dir_made_private(tmp_path, monkeypatch, no_own_variable):
    root = tmp_path / "a" / "root"
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    codegen = CppCodegen()
    check_against_eager(_fn, _inputs(), codegen=codegen)
    assert codegen.last_library.parent.parent == root / "cpp"
    for folder in (tmp_path / "a", root, root / "cpp", codegen.last_library.parent):
        assert _mode(folder) == 0o700, folder


def test_cache_root_wins_over_kiln_cache_dir(tmp_path, monkeypatch, no_own_variable):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "env"))
    codegen = CppCodegen()
    with kiln_cpp.cache_root(tmp_path / "given"):
        check_against_eager(_fn, _inputs(), codegen=codegen)
    assert codegen.last_library.parent.parent == tmp_path / "given" / "cpp"
    assert not (tmp_path / "env").exists()


def test_own_variable_wins_over_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "own"))
    codegen = CppCodegen()
    with kiln_cpp.cache_root(tmp_path / "given"):
        check_against_eager(_fn, _inputs(), codegen=codegen)
    assert codegen.last_library.parent.parent == tmp_path / "own"
    assert not (tmp_path / "given").exists()


@pytest.mark.parametrize("variable", ["KILN_CACHE_DIR", "KILN_CPP_CACHE_DIR"])
def test_a_folder_others_can_write_is_refused_once(tmp_path, monkeypatch, variable):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.delenv("KILN_CPP_CACHE_DIR", raising=False)
    monkeypatch.setenv(variable, str(shared))
    forget_refusals()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            codegen = CppCodegen()
            check_against_eager(_fn, _inputs(), codegen=codegen)  # compiled all the same
    refusals = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(refusals) == 1, [str(w.message) for w in caught]
    message = str(refusals[0].message)
    assert str(shared) in message and "chmod 700" in message
    assert list(shared.iterdir()) == [], "nothing was written to the refused folder"
    assert not codegen.last_library.is_relative_to(shared)


def test_cache_root_none_turns_the_disk_cache_off(tmp_path, monkeypatch, no_own_variable):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "env"))
    codegen = CppCodegen()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with kiln_cpp.cache_root(None):
            check_against_eager(_fn, _inputs(), codegen=codegen)
    assert not (tmp_path / "env").exists()
    assert _mode(codegen.last_library.parent.parent) == 0o700


def test_unsafe_reason_names_the_mode(tmp_path):
    tmp_path.chmod(0o700)
    assert cache_dirs.unsafe_reason(tmp_path) is None
    tmp_path.chmod(0o770)
    assert "0o770" in cache_dirs.unsafe_reason(tmp_path)


def test_the_host_runtime_is_built_in_the_installation_whatever_the_cache(monkeypatch, tmp_path):
    """The runtime belongs to the installation: a compile with an empty cache root finds
    it there instead of building it again under the root."""
    from kiln_cpp.host import runtime

    monkeypatch.delenv("KILN_CPP_RUNTIME_DIR", raising=False)
    installed = runtime.installed_folder()
    if installed is None:
        pytest.skip("the installation is not this user's to write (read-only site-packages)")
    assert installed == runtime.INSTALLED
    assert stat.S_IMODE(installed.stat().st_mode) == 0o700
    with kiln_cpp.cache_root(tmp_path / "empty"):
        assert runtime.runtime_dir() == installed
    assert not (tmp_path / "empty" / "runtime").exists()
    # the variable still wins
    monkeypatch.setenv("KILN_CPP_RUNTIME_DIR", str(tmp_path / "mine"))
    assert runtime.runtime_dir() == tmp_path / "mine"
