"""Numbers read from tensor data (``.item()``, traced to ``aten._local_scalar_dense``) used
as sizes and as scalar operands: the host program binds ``u0`` from the read and passes it
to the kernels, so one compiled graph serves every value the data holds."""

import pytest
import torch

from kiln_loopir.ir import ExternNode
from kiln_loopir.testing import compare_outputs, compile_fn


def _check(fn, make_inputs, values, codegen="reference"):
    """Compile ``fn`` once on the first value's inputs, then run it on fresh random inputs
    for each value and compare with eager."""
    compiled = compile_fn(fn, make_inputs(values[0]), codegen=codegen)
    for value in values:
        inputs = make_inputs(value)
        compare_outputs(list(compiled(*inputs)), list(_flat(fn(*inputs))))
    return compiled


def _flat(value):
    return value if isinstance(value, (tuple, list)) else (value,)


def _vector_and(n):
    return lambda value: [torch.randn(n), torch.tensor(value)]


def test_item_as_slice_end():
    compiled = _check(lambda x, n: x[: n.item()] * 2, _vector_and(10), [4, 7, 10, 13, -3, 0])
    reads = [s for s in compiled.schedule.steps if isinstance(s, ExternNode) and s.binds]
    assert reads, "the read and the slice's size are steps of the schedule"
    assert "= aten__local_scalar_dense_default(" in compiled.host_source


def test_item_as_slice_start_and_select_index():
    def fn(x, n):
        k = n.item()
        return x[k:] + 1, x.select(0, k) * 3

    _check(fn, lambda v: [torch.randn(9, 4), torch.tensor(v)], [2, 5, 0, 8])


def test_item_as_narrow_start():
    """The tracer writes the end bound as a Piecewise of the read: the host prints it."""
    _check(lambda x, n: x.narrow(0, n.item(), 3) * 2, _vector_and(8), [2, 5, 0, -4])


def test_item_as_arange_and_new_zeros_size():
    def fn(x, n):
        k = n.item()
        return torch.arange(k, dtype=torch.float32) * x[0] + x.new_zeros(k), x.new_ones(k, 3)

    _check(fn, _vector_and(5), [3, 6, 1, 11])


def test_item_as_scalar_multiplier():
    _check(lambda x, t: x * t.item(), _vector_and(8), [3, -2, 7])
    ints = lambda v: [torch.randint(-50, 50, (2, 5)), torch.tensor(v)]  # noqa: E731
    _check(lambda x, t: x * t.item() + t.item(), ints, [4, 9, -1])


def test_float_item_as_operand():
    """A float read is loaded by the kernel from the tensor; type promotion treats it as
    the Python float ``.item()`` gives (an int tensor times it is float32)."""

    def fn(x, t):
        return (x - t.item()) / t.item() + (x > t.item()), x.long() * t.item()

    def make(dtype):
        return lambda v: [torch.randn(8, dtype=dtype), torch.tensor(v, dtype=torch.float64)]

    for dtype in (torch.float32, torch.bfloat16):
        _check(fn, make(dtype), [1.5, -0.25, 3.0])
    _check(lambda x: x * x.sum().item(), lambda v: [torch.randn(6) + v], [0.0, 2.0])


def test_two_reads_in_one_graph():
    def fn(x, a, b):
        return x[: a.item()].sum(0), x[:, : b.item()] * a.item()

    def make(values):
        return [torch.randn(6, 7), torch.tensor(values[0]), torch.tensor(values[1])]

    _check(fn, make, [(3, 5), (6, 1), (1, 7), (2, 2)])


def test_value_read_changes_between_calls():
    """The size is data-dependent: one graph, compiled once, gives the right length and
    values for every count of positive elements."""

    def fn(x):
        k = (x > 0).sum().item()  # the read follows a kernel; the slice kernel follows it
        return x[:k] * 2, torch.arange(k) + k

    compiled = compile_fn(fn, [torch.randn(12)])
    for _ in range(4):
        x = torch.randn(12)
        compare_outputs(list(compiled(x)), list(fn(x)))
    x = -torch.rand(12) - 0.1  # none positive: empty results
    compare_outputs(list(compiled(x)), list(fn(x)))


def test_reduction_over_data_dependent_size():
    def fn(x, n):
        k = n.item()
        head = x[:k]
        return head.sum(0), head.amax(1), torch.softmax(head, 0)

    _check(fn, lambda v: [torch.randn(16, 5), torch.tensor(v)], [9, 2, 16, 1])


def test_extern_op_on_a_data_dependent_view():
    """A matmul (run through ATen) of rows bounded by a read runs after the read."""

    def fn(x, w, n):
        return torch.relu(x[: n.item()] @ w) + 1

    def make(value):
        return [torch.randn(8, 6), torch.randn(6, 3), torch.tensor(value)]

    _check(fn, make, [5, 8, 1])


def test_read_returned_as_a_number():
    """A read only the outputs use is kept (dead-node elimination sees the symbol)."""
    _check(lambda x, n: (x * 2, n.item() + 1), _vector_and(4), [3, -8])


def test_cpp_codegen_passes_the_read_as_a_size():
    pytest.importorskip("kiln_cpp")

    def fn(x, n):
        k = n.item()
        head = x[:k] * k
        return head.sum(0), torch.arange(k) * 2, x.select(0, k - 1) + 1, x * x[0, 0].item()

    _check(fn, lambda v: [torch.randn(16, 5), torch.tensor(v)], [9, 2, 16], codegen="cpp")
