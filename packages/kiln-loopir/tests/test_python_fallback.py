"""What runs a call a native host program hands back: the Python program (compiled at the
first such call), then (where the native program learns sizes) its ``learn_sizes`` with
every input."""

import torch

from kiln_loopir.compile import python_fallback


def _program(x, y):  # a Python host program taking two inputs
    return (x + y,)


def test_the_python_program_gets_the_inputs_it_takes():
    x, y, constant = torch.randn(3), torch.randn(3), torch.randn(3)
    (out,) = python_fallback(lambda: _program, None)(x, y, constant)
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
    (out,) = python_fallback(lambda: program, learn)(x, y, constant)
    torch.testing.assert_close(out, x * y)
    assert order == ["python", "learn"]
    (inputs,) = seen
    assert len(inputs) == 3 and all(t is u for t, u in zip(inputs, (x, y, constant), strict=True))


class FakeNative:
    """What load_host_program asks of a native program."""

    def __init__(self):
        self.fallback = None

    def set_fallback(self, fallback):
        self.fallback = fallback

    def __call__(self, *inputs):
        return self.fallback(*inputs)  # hands every call back


def test_with_a_native_program_the_python_one_compiles_when_first_needed():
    from kiln_loopir.compile import load_host_program

    compiled: list[str] = []
    source = 'compiled.append("now")\ndef call(x):\n    return (x * 3,)\ndef check(x):\n    pass\n'
    native = FakeNative()
    program = load_host_program(source, {"compiled": compiled}, {}, native=native)
    assert compiled == [] and program.call is native
    x = torch.randn(4)
    (out,) = program.call(x)  # the native program hands the call back: compiled now
    torch.testing.assert_close(out, x * 3)
    assert compiled == ["now"]
    assert program.input_names == ("x",) and compiled == ["now"]  # once


def test_without_a_native_program_the_python_one_is_compiled_at_load():
    from kiln_loopir.compile import load_host_program

    compiled: list[str] = []
    source = 'compiled.append("now")\ndef call(x):\n    return (x + 1,)\ndef check(x):\n    pass\n'
    program = load_host_program(source, {"compiled": compiled}, {})
    assert compiled == ["now"]
    x = torch.randn(4)
    torch.testing.assert_close(program(x)[0], x + 1)
