"""kiln-triton's cache folder: ``<root>/triton`` under kiln-cpp's cache root unless
``$KILN_TRITON_CACHE_DIR`` is set, made private, refused where others can write."""

import stat
import warnings

import kiln_cpp
from kiln_loopir.cache_folders import forget_refusals
from kiln_triton import autotune
from kiln_triton.configs import Config


def test_the_cache_lies_under_the_root_made_private(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_TRITON_CACHE_DIR")
    with kiln_cpp.cache_root(tmp_path / "root"):
        folder = autotune.cache_dir()
    assert folder == tmp_path / "root" / "triton"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_its_own_variable_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(tmp_path / "own"))
    with kiln_cpp.cache_root(tmp_path / "root"):
        assert autotune.cache_dir() == tmp_path / "own"


def test_a_shared_folder_is_refused_with_a_warning(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("KILN_TRITON_CACHE_DIR", str(shared))
    forget_refusals()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = autotune.cache_dir()
        autotune.save_winner("k", Config("k", (("XBLOCK", 64),)), {}, folder)
    assert [w.category for w in caught] == [RuntimeWarning]
    assert "kiln-triton" in str(caught[0].message) and str(shared) in str(caught[0].message)
    assert not folder.is_relative_to(shared) and list(shared.iterdir()) == []
