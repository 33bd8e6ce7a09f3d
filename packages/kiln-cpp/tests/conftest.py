import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def cpp_cache(tmp_path_factory):
    """One fresh library cache for the test session, so cache tests see only their own."""
    path = tmp_path_factory.mktemp("kiln-cpp-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CPP_CACHE_DIR", str(path))
    yield path
    mp.undo()


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """The test runs at one thread, then at two (torch's and kiln-cpp's OpenMP count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
