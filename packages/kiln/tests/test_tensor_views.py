"""kiln-cpp's TensorsOn makes the tensors a CUDA-graph replay hands out: the same tensors as
kiln-cudagraphs' Python reference (``torch.empty(0).set_(storage, offset, size, stride)``)."""

import torch

from kiln import tensor_views


def test_native_views_equal_the_reference():
    block = torch.randn(64)
    storage = block.untyped_storage()
    specs = [
        (torch.float32, (4, 5), (5, 1), 3),
        (torch.float32, (5, 4), (1, 5), 3),  # a transposed view of the first
        (torch.int32, (6,), (1,), 40),
        (torch.float64, (2, 3), (3, 1), 2),
    ]
    make = tensor_views.native_view_maker(specs)
    assert make is not None  # the runtime builds on this machine (a C++ compiler is there)
    got = make(storage)
    for t, (dtype, size, stride, offset) in zip(got, specs, strict=True):
        want = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
        assert (t.dtype, t.shape, t.stride(), t.storage_offset()) == (
            dtype, size, stride, offset
        )  # fmt: skip
        assert t.untyped_storage().data_ptr() == storage.data_ptr() and t._base is None
        assert torch.equal(t, want)
    block.add_(1.0)  # they are over the storage, not copies of it
    assert torch.equal(got[0], block[3:23].view(4, 5))
