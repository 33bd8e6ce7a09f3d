"""Without a CUDA device the kernels run on CPU tensors in Triton's interpreter: set
``TRITON_INTERPRET=1`` before triton is imported. With one, they run on the GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@pytest.fixture(scope="session", autouse=True)
def triton_cache(tmp_path_factory):
    """One fresh cache (kernels, autotuning winners) for the test session, unless
    ``KILN_TRITON_CACHE_DIR`` names one (a GPU run shares it with the benchmark)."""
    if os.environ.get("KILN_TRITON_CACHE_DIR"):
        import pathlib

        yield pathlib.Path(os.environ["KILN_TRITON_CACHE_DIR"])
        return
    path = tmp_path_factory.mktemp("kiln-triton-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_TRITON_CACHE_DIR", str(path))
    yield path
    mp.undo()


@pytest.fixture
def device():
    return DEVICE


def needs_cuda():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
