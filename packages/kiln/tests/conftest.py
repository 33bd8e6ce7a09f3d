import pathlib
import sys

import pytest

import kiln

_HERE = pathlib.Path(__file__).parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))


@pytest.fixture(scope="session", autouse=True)
def fresh_caches(tmp_path_factory):
    """Fresh on-disk caches (Kiln's graphs, kiln-cpp's libraries) for the test session."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
    mp.setenv("KILN_CPP_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cpp-cache")))
    yield
    mp.undo()


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
