"""The fresh outputs of a replay, checked on CPU tensors (the plan is device-agnostic)."""

import pytest
import torch

from kiln_cudagraphs import outputs
from kiln_cudagraphs.outputs import OutputPlan, UnsupportedOutput


def test_outputs_are_copies_with_their_layout():
    static_in = [torch.randn(4, 6)]
    base = torch.randn(40)
    a = base[8:32].view(4, 6)  # offset into a larger block of graph memory
    b = a.t()  # a view of another output
    plan = OutputPlan((a, b, 3), static_in)
    out = plan.fresh(static_in)
    assert isinstance(out, tuple) and out[2] == 3
    torch.testing.assert_close(out[0], a, rtol=0, atol=0)
    torch.testing.assert_close(out[1], b, rtol=0, atol=0)
    assert out[0].stride() == a.stride() and out[1].stride() == b.stride()
    assert out[0].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    # views of one another stay views of one another, at the same relative offset
    assert out[0].untyped_storage().data_ptr() == out[1].untyped_storage().data_ptr()
    assert out[1].storage_offset() == out[0].storage_offset()
    base.add_(1.0)  # the next replay writes the graph's memory: the copies keep their values
    torch.testing.assert_close(out[0], a - 1.0)


def test_output_that_is_an_input_is_the_callers_input():
    static_x = torch.randn(4, 6)
    plan = OutputPlan([static_x, static_x[1:].t(), torch.randn(2)], [static_x])
    x = torch.randn(4, 6)
    same, view, fresh = plan.fresh([x])
    assert same is x
    assert view._base is x and torch.equal(view, x[1:].t())
    assert fresh.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_empty_outputs():
    plan = OutputPlan([torch.empty(0, 3)], [torch.randn(2)])
    (out,) = plan.fresh([torch.randn(2)])
    assert out.shape == (0, 3)


def test_reinterpreted_input_is_refused():
    x = torch.randn(4)
    with pytest.raises(UnsupportedOutput, match="output 0 is a torch.int32 view of input 0"):
        OutputPlan([x.view(torch.int32)], [x])


def test_outputs_of_several_blocks_are_copied_into_one():
    static_in = [torch.randn(3)]
    a = torch.randn(5, 3)  # three outputs in three blocks of graph memory, of two dtypes
    b = torch.randint(0, 9, (7,))
    c = torch.randn(2, 2).to(torch.float64).t()
    plan = OutputPlan([a, b, c], static_in)
    out = plan.fresh(static_in)
    for got, want in zip(out, (a, b, c), strict=True):
        assert got.dtype == want.dtype and got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got.data_ptr() % 16 == 0
    assert len({t.untyped_storage().data_ptr() for t in out}) == 1
    a.neg_()
    torch.testing.assert_close(out[0], -a)


def test_a_registered_view_maker_makes_the_outputs_in_graph_memory(monkeypatch):
    calls = []

    def factory(specs):
        def make(storage):
            calls.append(len(specs))
            return [
                torch.empty(0, dtype=d, device=storage.device).set_(storage, o, size, stride)
                for d, size, stride, o in specs
            ]

        return make

    monkeypatch.setattr(outputs, "_view_makers", [])
    outputs.register_view_maker(factory)
    static_x = torch.randn(3)
    a, b = torch.randn(4, 2), torch.randn(5)
    plan = OutputPlan([a, static_x, b], [static_x])
    got = plan.fresh([static_x])
    # one call for the copy's targets in the new block (a span each), one for both outputs
    # in graph memory; the input is passed on
    assert calls == [2, 2]
    assert got[1] is static_x
    torch.testing.assert_close(got[0], a, rtol=0, atol=0)
    torch.testing.assert_close(got[2], b, rtol=0, atol=0)


def test_kept_outputs_are_handed_out_over_graph_memory_until_they_die():
    static_in = [torch.randn(3)]
    user = torch.randn(4, 3)
    saved = torch.randn(6, 5)  # a saved tensor: only the backward reads it
    shared = torch.randn(8)  # kept, but a user output is a view of it: copied
    plan = OutputPlan([user, saved, shared[2:], shared[:4]], static_in, kept={1, 2})
    assert plan.copy_bytes < user.nbytes + saved.nbytes + shared.nbytes
    out_user, out_saved, out_kept_view, out_view = plan.fresh(static_in)
    assert out_saved.data_ptr() == saved.data_ptr()  # no copy
    assert out_user.data_ptr() != user.data_ptr()
    assert out_kept_view.data_ptr() != shared[2:].data_ptr()  # shares memory with output 3
    torch.testing.assert_close(out_saved, saved, rtol=0, atol=0)
    assert out_kept_view.untyped_storage().data_ptr() == out_view.untyped_storage().data_ptr()
    assert plan.in_use()  # the saved tensor is alive: a replay must not overwrite it
    saved.add_(1.0)
    torch.testing.assert_close(out_saved, saved)  # it is graph memory
    del out_saved
    assert not plan.in_use()
    assert out_user.data_ptr() != plan.fresh(static_in)[0].data_ptr()


def _in_own_storage(memory: torch.Tensor, start: int, size: tuple, dtype) -> torch.Tensor:
    """A tensor at byte ``start`` of ``memory`` with a storage of its own, as the outputs of
    a graph are: separate allocations, next to one another in the graph's memory."""
    nbytes = torch.Size(size).numel() * dtype.itemsize
    storage = torch._C._construct_storage_from_data_pointer(
        memory.data_ptr() + start, memory.device, nbytes
    )
    return torch.empty(0, dtype=dtype).set_(storage, 0, size)


def test_outputs_next_to_one_another_are_copied_in_one_copy(monkeypatch):
    """A backward's gradients lie side by side in graph memory: the range they fill is
    copied at once (no multi-tensor copy), and each is rebuilt at its place in the copy."""
    memory = torch.randn(64)  # 256 bytes of graph memory
    a = _in_own_storage(memory, 0, (4, 5), torch.float32)  # bytes 0-80
    b = _in_own_storage(memory, 96, (3, 4), torch.float32)  # bytes 96-144
    c = _in_own_storage(memory, 144, (8,), torch.float64)  # bytes 144-208
    static_in = [torch.randn(3)]
    plan = OutputPlan([a, b.t(), c], static_in)
    assert plan.copy_bytes == 208  # the range, gaps included
    monkeypatch.setattr(outputs.CopyPlan, "__call__", None)  # a copy per span would raise
    got = plan.fresh(static_in)
    for out, want in zip(got, (a, b.t(), c), strict=True):
        assert out.dtype == want.dtype and out.stride() == want.stride()
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert got[0].untyped_storage().data_ptr() != memory.data_ptr()
    memory.neg_()  # the next replay: the copies keep this call's values
    torch.testing.assert_close(got[0], -a, rtol=0, atol=0)
    again = plan.fresh(static_in)
    torch.testing.assert_close(again[2], c, rtol=0, atol=0)


def test_outputs_far_apart_are_copied_span_by_span():
    memory = torch.randn(1024)
    a = _in_own_storage(memory, 0, (4,), torch.float32)
    b = _in_own_storage(memory, 4000, (4,), torch.float32)  # the range would be 250x their bytes
    plan = OutputPlan([a, b], [torch.randn(3)])
    assert plan.copy_bytes == 32
    got = plan.fresh([torch.randn(3)])
    torch.testing.assert_close(got[1], b, rtol=0, atol=0)
