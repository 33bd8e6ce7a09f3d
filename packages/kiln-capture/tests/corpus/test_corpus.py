"""The capture corpus run through kiln_capture.capture with a counting eager backend."""

import pytest
from harness import check_case, load_cases

import kiln_capture

capture = getattr(kiln_capture, "capture", None)

CASES = load_cases()

# Constructs capture does not handle yet. Each still returns the right result (it runs
# eagerly or breaks the graph where torch.compile keeps going); strict, so that a fix shows.
KNOWN_GAPS: dict[str, str] = {}


def marked(case_id, case):
    gap = KNOWN_GAPS.get(case_id)
    if gap is None:
        return case
    return pytest.param(case, marks=pytest.mark.xfail(reason=gap, strict=True))


def test_corpus_size():
    assert len(CASES) >= 300
    names = [case.name for _, case in CASES]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"case names must be unique: {duplicates}"


@pytest.mark.skipif(capture is None, reason="kiln_capture.capture is not available")
@pytest.mark.parametrize(
    "case", [marked(cid, case) for cid, case in CASES], ids=[cid for cid, _ in CASES]
)
def test_case(case):
    check_case(case, capture)
