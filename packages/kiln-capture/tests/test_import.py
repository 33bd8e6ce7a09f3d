import re

import kiln_capture


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", kiln_capture.__version__)


def test_public_api_is_pinned():
    assert sorted(kiln_capture.__all__) == ["__version__"]
