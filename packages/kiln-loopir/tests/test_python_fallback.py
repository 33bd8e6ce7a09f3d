"""What runs a call a native host program hands back: the Python program, then (where the
native program learns sizes) its ``learn_sizes`` with every input."""

import torch

from kiln_loopir.compile import python_fallback


def _program(x, y):  # a Python host program taking two inputs
    return (x + y,)


def test_the_python_program_gets_the_inputs_it_takes():
    x, y, constant = torch.randn(3), torch.randn(3), torch.randn(3)
    (out,) = python_fallback(_program, None)(x, y, constant)
    torch.testing.assert_close(out, x + y)


def test_sizes_are_learned_after_the_python_program_ran():
    order: list[str] = []

    def program(x, y):
        order.append("python")
        return (x * y,)

    def learn(inputs):
        order.append("learn")
        seen.append(inputs)

    seen: list[tuple] = []
    x, y, constant = torch.randn(2, 5), torch.randn(2, 5), torch.randn(5)
    (out,) = python_fallback(program, learn)(x, y, constant)
    torch.testing.assert_close(out, x * y)
    assert order == ["python", "learn"]
    (inputs,) = seen
    assert len(inputs) == 3 and all(t is u for t, u in zip(inputs, (x, y, constant), strict=True))
