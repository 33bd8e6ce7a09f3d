"""Topics whose programs must capture whole: one graph, no graph break, no frame run
eagerly (the graph count alone misses a break before the first tensor op)."""

import warnings

import pytest
import torch
from harness import load_cases

from kiln_capture import explain

WHOLE_TOPICS = ("torchscript-", "class_statements-closure_")
# Cases of those topics that must not capture whole, and why.
NOT_WHOLE = {"class_statements-closure_class_escapes": "the class leaves the frame"}
CASES = [
    (cid, case)
    for cid, case in load_cases()
    if cid.startswith(WHOLE_TOPICS) and cid not in NOT_WHOLE
]


@pytest.mark.parametrize("case", [case for _, case in CASES], ids=[cid for cid, _ in CASES])
def test_captures_whole(case):
    torch.manual_seed(0)
    kwargs = case.kwargs() if case.kwargs is not None else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # capture warns where a frame ran eagerly
        report = explain(case.fn)(*case.make_args(), **kwargs)
    assert not report.graph_breaks, str(report)
    assert not report.eager, str(report)
    assert report.graph_count == 1, str(report)
