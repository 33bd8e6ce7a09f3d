"""ndarrays passed into a captured frame are graph inputs over their memory, guarded as
tensors; arrays torch cannot view run natively."""

import numpy as np
from recording import Recorder

from kiln_capture import capture


def scaled_sum(a):
    return np.sin(a).sum(axis=1) * 2, a


def test_an_ndarray_argument_is_a_graph_input_and_comes_back_itself():
    backend = Recorder()
    fn = capture(scaled_sum, backend)
    a = np.random.randn(3, 4)
    total, same = fn(a)
    np.testing.assert_allclose(total, scaled_sum(a)[0])
    assert same is a and type(total) is np.ndarray and total.dtype == np.float64
    (graph,) = backend.graphs
    assert graph.meta["kiln_input_sources"] == ["___ndarray_tensor(a)"]


def test_a_new_size_recompiles_once_with_a_dynamic_dimension():
    backend = Recorder()
    fn = capture(scaled_sum, backend)
    for rows in (3, 4, 5, 6):
        a = np.random.randn(rows, 2)
        np.testing.assert_allclose(fn(a)[0], scaled_sum(a)[0])
    assert len(backend.graphs) == 2
    assert "dims [0] dynamic" in fn.cache_entries()[0].guard_source


def test_an_array_torch_cannot_view_runs_natively():
    fn = capture(scaled_sum, Recorder())
    a = np.random.randn(3, 4)
    for array in (a[::-1], a.astype(">f8"), a):
        np.testing.assert_allclose(fn(array)[0], scaled_sum(array)[0])
