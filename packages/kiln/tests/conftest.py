import pathlib
import sys
import warnings

import pytest

import kiln

_HERE = pathlib.Path(__file__).parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))


@pytest.fixture(scope="session", autouse=True)
def fresh_caches(tmp_path_factory):
    """Fresh on-disk caches (Kiln's graphs, kiln-cpp's libraries) for the test session;
    kiln-cpp's host runtime (a slow build, the same for every session) where it was."""
    mp = pytest.MonkeyPatch()
    runtime = kiln.cache_folders.part_folder(kiln.cache_folders.default_root(), "runtime")
    mp.setenv("KILN_CPP_RUNTIME_DIR", str(runtime))
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
    mp.setenv("KILN_CPP_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cpp-cache")))
    yield
    mp.undo()


@pytest.fixture
def lowerings(monkeypatch):
    """One entry per lowering (kiln-loopir's ``compile_fx`` of one aten graph): whether its
    sizes were symbolic."""
    from helpers import symbolic

    import kiln.pipeline

    seen: list[bool] = []
    real = kiln.pipeline.kiln_loopir.compile_fx

    def counting(gm, example_inputs, **kwargs):
        seen.append(symbolic(example_inputs))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(kiln.pipeline.kiln_loopir, "compile_fx", counting)
    return seen


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of the test's own: a graph another test stored is not loaded unlowered."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln-cache"))


@pytest.fixture
def warnings_are_errors():
    """A graph that ran eagerly instead would warn: that fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.fixture(autouse=True)
def reset_kiln():
    kiln.reset()
    yield


def pytest_terminal_summary(terminalreporter):
    """The OpInfo sweep's table (per dtype: samples passed, eager, failed, extern calls)."""
    import opinfo_sweep

    if opinfo_sweep.RESULTS:
        terminalreporter.write_sep("=", "OpInfo samples through kiln.compile")
        terminalreporter.write_line(opinfo_sweep.table(opinfo_sweep.RESULTS))
