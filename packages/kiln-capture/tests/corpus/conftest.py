"""Corpus test setup: the harness is importable by its plain name; the oracle is opt-in."""

import pathlib
import sys

import pytest

_HERE = pathlib.Path(__file__).parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))


def pytest_collection_modifyitems(config, items):
    # The torch.compile oracle checks the corpus, not Kiln, and takes over a minute: a plain
    # `pytest packages/kiln-capture/tests/corpus` skips it; `-m slow` runs it.
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="checks the corpus against torch.compile; run with -m slow")
    for item in items:
        if item.get_closest_marker("slow") and _HERE in pathlib.Path(item.path).parents:
            item.add_marker(skip)
