"""One cache root: graphs, kiln-cpp's libraries and runtime, kiln-triton's kernels under
it; folders private to the user; a root others can write to refused; ``python -m kiln
cache info|clear`` and ``kiln.cache_info()`` / ``kiln.clear_cache()``."""

import os
import stat
import subprocess
import sys
import warnings

import pytest
import torch
from helpers import Block

import kiln
import kiln_cpp
from kiln_loopir.cache_folders import forget_refusals


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A root of the test's own, with kiln-cpp's libraries under it (no variable of its own)."""
    monkeypatch.delenv("KILN_CPP_CACHE_DIR")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "root"))
    forget_refusals()
    return tmp_path / "root"


def compile_and_check():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 16)
    torch.testing.assert_close(kiln.compile(model)(x), model(x))


def test_graphs_and_libraries_lie_under_one_private_root(root):
    builds = kiln_cpp.cpp_codegen.builds
    compile_and_check()
    assert kiln_cpp.cpp_codegen.builds > builds
    graphs = sorted((root / "graphs").rglob("*.pt"))
    libraries = sorted((root / "cpp").glob("*/kernels.so"))
    assert graphs and libraries
    assert sorted(p.name for p in root.iterdir()) == ["cpp", "graphs"]
    for folder in (root, root / "graphs", graphs[0].parent, root / "cpp", libraries[0].parent):
        assert _mode(folder) == 0o700, folder
    kiln.reset()  # as a second process would: the graph and its library come from the root
    builds = kiln_cpp.cpp_codegen.builds
    compile_and_check()
    assert "cache_load" in kiln.compile_times() and "loopir" not in kiln.compile_times()
    assert kiln_cpp.cpp_codegen.builds == builds


def test_the_cache_dir_option_is_the_root_of_the_code_generators_too(root, tmp_path):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 16)
    given = tmp_path / "given"
    out = kiln.compile(model, options={"cache_dir": str(given)})(x)
    torch.testing.assert_close(out, model(x))
    assert list((given / "graphs").rglob("*.pt")) and list((given / "cpp").glob("*/kernels.so"))
    assert not root.exists()


def test_a_root_others_can_write_is_refused_once(root):
    root.mkdir()
    root.chmod(0o777)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile_and_check()  # compiled all the same, just not cached
        kiln.reset()
        compile_and_check()
    refusals = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(refusals) == 1, [str(w.message) for w in caught]
    assert str(root) in str(refusals[0].message) and "chmod 700" in str(refusals[0].message)
    assert "loopir" in kiln.compile_times(), "nothing was loaded from the refused root"
    assert list(root.iterdir()) == [], "nothing was written there"


def test_cache_info_and_clear_cache(root):
    compile_and_check()
    info = kiln.cache_info()
    assert info.root == root
    parts = {part.name: part for part in info.parts}
    assert list(parts) == ["graphs", "cpp", "runtime", "triton", "timings"]
    assert parts["graphs"].entries >= 1 and parts["cpp"].entries >= 1
    assert parts["graphs"].size_bytes > 0 and info.size_bytes >= parts["cpp"].size_bytes > 0
    assert parts["triton"].entries == 0 and parts["triton"].path == root / "triton"
    assert "graphs" in str(info) and str(root) in str(info)
    kiln.clear_cache()
    assert not root.exists()
    assert kiln.cache_info().size_bytes == 0


def _cli(*args, env):
    done = subprocess.run(
        [sys.executable, "-m", "kiln", "cache", *args],
        env={**env, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cache_command_line(root):
    compile_and_check()
    env = dict(os.environ)
    shown = _cli("info", env=env)
    assert str(root) in shown
    for name in ("graphs", "cpp", "runtime", "triton", "total"):
        assert name in shown
    graphs_line = next(line for line in shown.splitlines() if line.startswith("graphs"))
    assert " 0 entries" not in graphs_line
    assert "removed" in _cli("clear", env=env)
    assert not root.exists()
    other = root.parent / "other"
    (other / "graphs").mkdir(parents=True)
    assert str(other) in _cli("info", "--dir", str(other), env=env)
    _cli("clear", "--dir", str(other), env=env)
    assert not other.exists()
