"""kiln-capture's graphs through kiln-autograd: outputs and gradients equal eager."""

import pytest
import torch

import kiln_autograd
import kiln_capture


def eager_compiler(gm, example_inputs):
    return gm.forward


def aot_backend(gm, example_inputs):
    return kiln_autograd.aot(gm, example_inputs, eager_compiler)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.unused = torch.nn.Linear(16, 16)  # gets no gradient, eagerly or compiled

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return (x + h).softmax(-1)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_module_through_capture_and_autograd(train):
    torch.manual_seed(0)
    model = Block()
    reference = Block()
    reference.load_state_dict(model.state_dict())
    captured = kiln_capture.capture(model, aot_backend)
    for _ in range(2):
        x = torch.randn(4, 16, requires_grad=train)
        x_ref = x.detach().clone().requires_grad_(train)
        out = captured(x)
        expected = reference(x_ref)
        torch.testing.assert_close(out, expected)
        if train:
            weights = torch.randn_like(out)
            (out * weights).sum().backward()
            (expected * weights).sum().backward()
            torch.testing.assert_close(x.grad, x_ref.grad)
            for (name, p), p_ref in zip(
                model.named_parameters(), reference.parameters(), strict=True
            ):
                if p_ref.grad is None:
                    assert p.grad is None, f"{name} got a gradient eager does not give"
                else:
                    torch.testing.assert_close(p.grad, p_ref.grad, msg=name)
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
