"""Checks the corpus itself against torch.compile: every expected graph count and result.

A case's expectation is torch.compile's unless the case sets `oracle_graphs` (with a comment
saying why the two counts differ), `oracle_xfail` (torch.compile gets the case wrong) or
`oracle_recompiles` (torch.compile captures again on the second call, Kiln does not).
"""

import dataclasses

import pytest
import torch
import torch._dynamo
from harness import check_case, load_cases

CASES = load_cases()


def torch_compile_capture(fn, backend):
    return torch.compile(fn, backend=backend)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo:UserWarning")
@pytest.mark.parametrize("case", [case for _, case in CASES], ids=[cid for cid, _ in CASES])
def test_oracle(case):
    torch._dynamo.reset()
    if case.oracle_xfail is not None:
        with pytest.raises(AssertionError):
            check_case(case, torch_compile_capture)
        pytest.xfail(case.oracle_xfail)
    expected = case.graphs if case.oracle_graphs is None else case.oracle_graphs
    if case.oracle_recompiles is not None:
        case = dataclasses.replace(case, recompiles_ok=True)
    check_case(case, torch_compile_capture, expected_graphs=expected)
