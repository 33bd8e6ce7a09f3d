"""Fake results made from the arguments' metadata (kiln_capture.fake_results), where a fake
run needs data on some torch versions (quantile's check of q on torch 2.11): each has the
size and dtype of the real result, and a captured quantile is one graph on every version."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

import kiln_capture
from kiln_capture import fake_results

CALLS = [
    ((4, 6), 0.3, {"dim": 1}),
    ((4, 6), 0.3, {"dim": -2, "keepdim": True}),
    ((3, 4, 5), torch.tensor([0.1, 0.9]), {"dim": 1}),
    ((3, 4, 5), torch.tensor([0.1, 0.9]), {"keepdim": True}),
    ((3, 4, 5), torch.tensor(0.5), {}),
    ((), 0.5, {"dim": 0, "keepdim": True}),
    ((4, 6), 1, {"axis": 0, "interpolation": "nearest"}),
]


@pytest.mark.parametrize("size, q, kwargs", CALLS)
def test_quantile_fake_result_is_shaped_as_the_real_one(size, q, kwargs):
    x = torch.randn(size, dtype=torch.float64)
    if isinstance(q, torch.Tensor):
        q = q.double()
    want = torch.quantile(x, q, **kwargs)
    with FakeTensorMode(allow_non_fake_inputs=True):
        got = fake_results.quantile(x, q, **kwargs)
    assert got.shape == want.shape and got.dtype == want.dtype


def test_a_fake_run_that_needs_data_takes_the_table_entry(monkeypatch):
    def needs_data(x, q, **kwargs):
        raise DataDependentOutputException(torch.ops.aten.equal.default)

    monkeypatch.setitem(fake_results.FAKE_RESULTS, needs_data, fake_results.quantile)
    with FakeTensorMode():
        got = fake_results.run_fake("call_function", needs_data, (torch.empty(3, 4), 0.5), {})
        assert got.shape == (), got.shape
        with pytest.raises(DataDependentOutputException):  # a q eager rejects: no answer
            fake_results.run_fake("call_function", needs_data, (torch.empty(3, 4), 2.0), {})


@pytest.mark.parametrize("method", [False, True])
def test_a_quantile_is_captured_in_one_graph(method):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def fn(x):
        q = torch.tensor([0.25, 0.75])
        found = x.quantile(q, dim=1) if method else torch.quantile(x.sin(), 0.3, dim=0)
        return found * 2

    x = torch.randn(4, 6)
    torch.testing.assert_close(kiln_capture.capture(fn, backend, fullgraph=True)(x), fn(x))
    assert len(graphs) == 1
