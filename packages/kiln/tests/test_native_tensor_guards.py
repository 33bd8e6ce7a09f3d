"""kiln's native tensor matcher (kiln-cpp's ``TensorsMatch``): the default for the
parameters and buffers of a guard, and it rejects every change the reference rejects."""

import torch

import kiln
from kiln.tensor_guards import native_matcher
from kiln_capture.tensor_match import TensorSpec, build_matcher, python_matcher


def _specs(tensors):
    return [TensorSpec.of(f"t{i}", t) for i, t in enumerate(tensors)]


def test_it_rejects_what_the_reference_rejects():
    tensors = [torch.nn.Parameter(torch.randn(3, 2)), torch.randn(4)]
    specs = _specs(tensors)
    reference, native = python_matcher(specs), native_matcher(specs, tensors)
    assert native is not None and native.name == "native"
    with torch.inference_mode():
        inference = torch.randn(4)
    changed = [
        [tensors[0].detach(), tensors[1]],  # type
        [torch.nn.Parameter(torch.randn(2, 3).t()), tensors[1]],  # strides
        [torch.nn.Parameter(torch.randn(3, 2).double()), tensors[1]],  # dtype
        [torch.nn.Parameter(torch.randn(3, 2), requires_grad=False), tensors[1]],
        [tensors[0], inference],  # dispatch keys
        [tensors[0], torch.randn(5)],  # size
        [tensors[0], torch.randn(2, 2)],  # rank
        [tensors[0], 4.0],  # not a tensor
    ]
    assert reference.check(*tensors) and native.check(*tensors)
    for args in changed:
        assert not reference.check(*args), args
        assert not native.check(*args), args
    assert not native.check(tensors[0])  # too few
    same = [torch.nn.Parameter(torch.randn(3, 2)), torch.randn(4)]  # fresh values, same specs
    assert native.check(*same) and reference.check(*same)


def test_guards_use_it_and_recompile_when_the_model_changes():
    assert build_matcher(_specs([torch.randn(2)]), [torch.randn(2)]).name == "native"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    compiled = kiln.compile(model)
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model.double()  # the same Parameter objects, another dtype
        torch.testing.assert_close(compiled(x.double()), model(x.double()))
    assert len(compiled._captured._captured.entries) == 2  # a second graph, not a wrong one
