import pytest


@pytest.fixture(scope="session", autouse=True)
def cpp_cache(tmp_path_factory):
    """One fresh library cache for the test session, so cache tests see only their own."""
    path = tmp_path_factory.mktemp("kiln-cpp-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CPP_CACHE_DIR", str(path))
    yield path
    mp.undo()
