"""Adjacent reduction loops that every access walks as one run become one loop
(kiln_loopir.loops), for a backend that asks; results stay eager's."""

import torch
import torch.nn.functional as F

from kiln_loopir import ReferenceCodegen, compile_fx
from kiln_loopir.loops import merged_from
from kiln_loopir.testing import trace_aten


class MergingReference(ReferenceCodegen):
    """The reference code generator, asking for merged reduction loops."""

    merges_reduction_loops = True


def _compiled(fn, inputs, merge=True):
    backend = MergingReference() if merge else ReferenceCodegen()
    return compile_fx(trace_aten(fn, inputs), inputs, codegen=backend)


def _reduction_ranges(compiled) -> list[list[int]]:
    return [[int(r) for r in k.reduction_ranges] for k in compiled.schedule.kernels()]


def test_a_batch_norms_image_loops_become_one():
    x = torch.randn(4, 6, 5, 7)
    w, b = torch.randn(6), torch.randn(6)

    def bn_relu(x, w, b):
        return (F.batch_norm(x, None, None, w, b, training=True).relu(),)

    compiled = _compiled(bn_relu, [x, w, b])
    assert [4, 35] in _reduction_ranges(compiled)  # H and W walked as one run of 35
    assert [4, 5, 7] in _reduction_ranges(_compiled(bn_relu, [x, w, b], merge=False))
    torch.testing.assert_close(compiled(x, w, b)[0], bn_relu(x, w, b)[0])


def test_all_three_loops_of_a_whole_sum_become_one():
    x = torch.randn(3, 4, 5)
    compiled = _compiled(lambda x: (x.sum(), x.amax()), [x])
    assert _reduction_ranges(compiled) == [[60]]
    got = compiled(x)
    torch.testing.assert_close(got[0], x.sum())
    torch.testing.assert_close(got[1], x.amax())
    # a reduction whose result is read again at every point: nodes over the whole space
    y = torch.randn(5, 5, 5)
    centred = _compiled(lambda y: (y - y.mean(), torch.std(y)), [y])
    assert [125] in _reduction_ranges(centred)
    got = centred(y)
    torch.testing.assert_close(got[0], y - y.mean())
    torch.testing.assert_close(got[1], torch.std(y))


def test_loops_that_are_not_one_run_stay_apart():
    x = torch.randn(4, 6, 5, 7)
    # the image transposed: W is read with stride 5, H with stride 1: no run of 35
    compiled = _compiled(lambda x: (x.transpose(2, 3).sum(dim=(0, 2, 3)),), [x])
    torch.testing.assert_close(compiled(x)[0], x.sum(dim=(0, 2, 3)))
    merged = [r for r in _reduction_ranges(compiled) if 35 in r]
    assert not merged
    # a position within the loops is a value (argmax): left as it is
    y = torch.randn(3, 4, 5)
    arg = _compiled(lambda y: (y.flatten(1).argmax(1),), [y])
    torch.testing.assert_close(arg(y)[0], y.flatten(1).argmax(1))


def test_merged_ranges_are_recognised_against_the_buffer():
    assert merged_from((8, 64, 1, 784), (8, 64, 28, 28))
    assert merged_from((8, 64, 28, 28), (8, 64, 28, 28))
    assert merged_from((1, 1, 125), (5, 5, 5))  # three loops, merged twice
    assert not merged_from((8, 64, 784, 1), (8, 64, 28, 28))
    assert not merged_from((8, 1, 64 * 784), (8, 64, 28, 28))
