"""The capture corpus run through kiln_capture.capture with a counting eager backend."""

import pytest
from harness import check_case, load_cases

import kiln_capture

capture = getattr(kiln_capture, "capture", None)

CASES = load_cases()


def test_corpus_size():
    assert len(CASES) >= 300
    names = [case.name for _, case in CASES]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"case names must be unique: {duplicates}"


@pytest.mark.skipif(capture is None, reason="kiln_capture.capture is not available")
@pytest.mark.parametrize("case", [case for _, case in CASES], ids=[cid for cid, _ in CASES])
def test_case(case):
    check_case(case, capture)
