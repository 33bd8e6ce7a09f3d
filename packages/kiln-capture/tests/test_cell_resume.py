"""Graph breaks in functions with cells (closures, ``nonlocal``, comprehensions reading a
local before 3.12): the code after the break resumes with the frame's cells, shared with the
functions made before the break, instead of running the whole function eagerly."""

import warnings
import zlib

import pytest
import torch
from recording import Recorder

from kiln_capture import capture


def unknown_call() -> int:
    """A C function capture does not trace: a graph break, with a constant result."""
    return zlib.crc32(b"kiln") % 3 + 1


def lambda_around_breaks(x):
    y = x.sin() * 2
    print("before the lambda is made")
    scale = lambda z: z * y + 1  # noqa: E731 - a lambda reading a local is the point
    a = scale(x)
    k = unknown_call()
    b = scale(a) * k
    print("after the lambda is called")
    return b + scale(y), a


def nested_function_made_after_break(x, bias):
    total = x.cos()
    print("first break")

    def add(t):
        return t + total + bias

    out = add(x)
    print("second break")
    return add(out) * 2


def nonlocal_rebinding(x):
    acc = x * 3

    def bump(t):
        nonlocal acc
        acc = acc + t

    bump(x)
    print("acc rebound before the break")
    bump(x.exp())
    middle = acc.clone()
    print("and after it")
    bump(middle)
    return acc, middle


def nonlocal_rebinding_by_trace_only(x):
    """The cell is rebound in the traced frame only, then read by a closure after the break."""
    acc = x + 1
    read = lambda: acc * 2  # noqa: E731
    acc = acc.tanh()
    print("break")
    first = read()
    acc = acc + first
    return read() + acc


def comprehensions_over_cell(x):
    w = x.abs() + 1
    squares = [w * i for i in range(3)]
    print("break between comprehensions")
    gen = sum(w / (i + 1) for i in range(2))
    return torch.stack(squares).sum(0) + gen + sum(v * w for v in (1, 2))


def argument_cell_and_escaping_closure(x, n):
    def times(t):
        return t * n + x

    y = times(x)
    print("break")
    return y, times


FUNCTIONS = [
    (lambda_around_breaks, lambda: (torch.randn(4),)),
    (nested_function_made_after_break, lambda: (torch.randn(4), torch.randn(4))),
    (nonlocal_rebinding, lambda: (torch.randn(3),)),
    (nonlocal_rebinding_by_trace_only, lambda: (torch.randn(3),)),
    (comprehensions_over_cell, lambda: (torch.randn(5),)),
]


@pytest.mark.parametrize("fn,make_args", FUNCTIONS, ids=[f.__name__ for f, _ in FUNCTIONS])
def test_a_function_with_cells_resumes_after_its_breaks(fn, make_args, capsys):
    backend = Recorder()
    captured = capture(fn, backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing runs eagerly
        for call in range(3):
            args = make_args()
            torch.testing.assert_close(captured(*args), fn(*args))
            if call == 0:
                compiled = len(backend.graphs)
    assert compiled >= 2, "the code before and after a break is in graphs"
    assert len(backend.graphs) == compiled, "later calls reuse the captures"
    printed = capsys.readouterr().out.splitlines()
    assert printed[: len(printed) // 2] == printed[len(printed) // 2 :]


def test_a_closure_returned_after_a_break_shares_the_frames_cell():
    backend = Recorder()
    captured = capture(argument_cell_and_escaping_closure, backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for n in (2, 3):
            x = torch.randn(3)
            y, times = captured(x, n)
            y_eager, times_eager = argument_cell_and_escaping_closure(x, n)
            torch.testing.assert_close(y, y_eager)
            other = torch.randn(3)
            torch.testing.assert_close(times(other), times_eager(other))
            assert times.__closure__[0].cell_contents == n
    assert backend.graphs


def test_a_resumed_nonlocal_write_reaches_the_closure_made_before_the_break():
    def fn(x):
        count = 0

        def step(t):
            nonlocal count
            count += 1
            return t * count

        a = step(x)
        print(end="")
        b = step(a)
        return b, count, step

    backend = Recorder()
    captured = capture(fn, backend)
    x = torch.randn(3)
    b, count, step = captured(x)
    torch.testing.assert_close(b, x * 2)
    assert count == 2
    step(x)  # the function handed out shares the cell the resumed code wrote
    assert step.__closure__[0].cell_contents == 3
    assert len(backend.graphs) >= 2


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x)


class ClosureModel(torch.nn.Module):
    """A forward with a closure over a local that calls a submodule with hooks (called at
    a graph break, captured on its own)."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(8, 8)
        self.hooked = Scale()
        self.post = torch.nn.Linear(8, 8)

    def forward(self, x):
        gate = self.pre(x).sigmoid()
        mix = lambda t: t * gate + x  # noqa: E731
        h = self.hooked(mix(x))
        return self.post(mix(h)).relu() + gate


def test_a_forward_with_a_closure_around_a_hooked_submodule():
    torch.manual_seed(0)
    model = ClosureModel()
    seen = []
    model.hooked.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    backend = Recorder()
    captured = capture(model, backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(2):
            x = torch.randn(4, 8)
            torch.testing.assert_close(captured(x), model(x))
    assert len(seen) == 4, "the hook ran for the captured and the eager calls"
    # before the hooked call, its forward (captured on its own), and after it
    assert len(backend.graphs) == 3
