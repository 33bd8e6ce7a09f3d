import re

import kiln


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln.__all__) == [
        "CacheInfo",
        "CachePart",
        "CompiledFunction",
        "CompiledModule",
        "Options",
        "Plugin",
        "__version__",
        "cache_info",
        "clear_cache",
        "compile",
        "compile_timeline",
        "compile_times",
        "disable",
        "explain",
        "list_backends",
        "mark_dynamic",
        "mark_static",
        "reset",
        "set_logs",
    ]
    for name in kiln.__all__:
        assert hasattr(kiln, name)
