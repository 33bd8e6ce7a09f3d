import re
from importlib import metadata

import pytest

import kiln_cudagraphs


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln_cudagraphs.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln_cudagraphs.__all__) == sorted(
        [
            "MAX_GRAPHS",
            "CudaGraphRunner",
            "CudaGraphStats",
            "__version__",
            "device_types",
            "register_view_maker",
            "stats",
            "wrap",
        ]
    )


def test_runtime_entry_point_resolves_to_a_plugin():
    found = [ep for ep in metadata.entry_points(group="kiln.runtime") if ep.name == "cudagraphs"]
    if not found:
        pytest.skip("kiln-cudagraphs is not installed: entry points exist once it is")
    plugin = found[0].load()
    assert plugin.device_types == ("cuda",)
    assert callable(plugin.wrap)
    assert isinstance(plugin.wrap(lambda x: (x,), []), kiln_cudagraphs.CudaGraphRunner)
