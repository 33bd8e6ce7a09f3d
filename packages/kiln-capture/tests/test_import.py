import re

import kiln_capture


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln_capture.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln_capture.__all__) == [
        "CapturedFunction",
        "CapturedModule",
        "ExplainOutput",
        "Unsupported",
        "__version__",
        "capture",
        "explain",
        "mark_dynamic",
        "mark_static",
    ]
    for name in kiln_capture.__all__:
        assert hasattr(kiln_capture, name)
