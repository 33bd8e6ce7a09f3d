"""kiln_autograd.aot as a torch.compile backend: the capture contract, as Dynamo fulfils it.

Dynamo's graphs take parameters and buffers as placeholders, carry a `no_grad` region as
`_set_grad_enabled` calls, and with dynamic shapes pass SymInts and the real tensors whose
fakes have symbolic sizes (found through the tracing context's fake mode).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import kiln_autograd


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        y = self.bn(self.fc(x))
        with torch.no_grad():
            z = y * 2
        return F.gelu(y) + z, y.view(-1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_aot_as_a_torch_compile_backend(dynamic):
    torch._dynamo.reset()
    backend_calls = []

    def backend(gm, example_inputs):
        backend_calls.append([type(e).__name__ for e in example_inputs])
        return kiln_autograd.aot(gm, example_inputs, lambda g, _: g)

    torch.manual_seed(0)
    model = Net().train()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, dynamic=False if not dynamic else None)
    for batch in (4, 6, 7):
        x = torch.randn(batch, 8, requires_grad=True)
        if dynamic:
            torch._dynamo.mark_dynamic(x, 0)
        x_ref = x.detach().clone().requires_grad_(True)
        out, expected = compiled(x), reference(x_ref)
        for a, e in zip(out, expected, strict=True):
            torch.testing.assert_close(a, e)
        (out[0].sum() + out[1].pow(2).sum()).backward()
        (expected[0].sum() + expected[1].pow(2).sum()).backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        for (name, a), (_, e) in zip(
            model.named_parameters(), reference.named_parameters(), strict=True
        ):
            torch.testing.assert_close(a.grad, e.grad, msg=name)
        for (name, a), (_, e) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
            torch.testing.assert_close(a, e, msg=name)
    if dynamic:
        assert len(backend_calls) == 1 and "SymInt" in backend_calls[0]
    torch._dynamo.reset()
