"""Graph breaks in functions with cells (closures, ``nonlocal``, comprehensions reading a
local before 3.12): the code after the break resumes with the frame's cells, shared with the
functions made before the break, instead of running the whole function eagerly."""

import warnings
import zlib

import pytest
import torch
from recording import Recorder

from kiln_capture import capture


def graphs_of_two_calls(fn, shape) -> list:
    """Capture ``fn``, call it twice on fresh inputs of ``shape`` (nothing may run eagerly),
    each call compared with eager's; the graphs captured."""
    backend = Recorder()
    captured = capture(fn, backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(2):
            x = torch.randn(*shape)
            torch.testing.assert_close(captured(x), fn(x))
    return backend.graphs


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


def make_scale(k):
    def scale(t):
        print(end="")  # a break inside: the call of ``scale`` is made at a graph break
        return t * k

    return scale


def call_closure_argument(x, f):
    y = x + 1
    return f(y) + 1


def test_a_closure_passed_in_is_called_as_this_calls_closure():
    """A function made in a frame is guarded on its code: the one called at a break is
    this call's (its cell holds this call's ``k``), never the first call's."""
    captured = capture(call_closure_argument, Recorder())
    for k in (2.0, 3.0, 4.0):
        x = torch.randn(3)
        expected = call_closure_argument(x, make_scale(k))
        torch.testing.assert_close(captured(x, make_scale(k)), expected)


def make_counter():
    count = 0

    def step(t):
        nonlocal count
        count += 1
        return t * count

    return step


def counts_with(x, step):
    a = step(x)
    print(end="")
    return step(a)


def test_a_passed_closures_nonlocal_write_reaches_its_own_cell():
    captured = capture(counts_with, Recorder())
    for _ in range(2):
        step, eager_step = make_counter(), make_counter()
        x = torch.randn(3)
        torch.testing.assert_close(captured(x, step), counts_with(x, eager_step))
        assert step.__closure__[0].cell_contents == 2


def make_offset(t):
    shift = t.mean()
    return lambda u: u - shift


def helper_closure_live_at_break(x):
    offset = make_offset(x)  # its cell was made in an inlined call, whose frame is gone
    print(end="")
    return offset(x * 2)


def test_a_closure_made_in_an_inlined_call_crosses_a_break():
    assert len(graphs_of_two_calls(helper_closure_live_at_break, (4,))) == 2


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
    graphs = graphs_of_two_calls(model, (4, 8))
    assert len(seen) == 4, "the hook ran for the captured and the eager calls"
    # before the hooked call, its forward (captured on its own), and after it
    assert len(graphs) == 3


def test_gpt2_with_hooked_blocks_keeps_the_code_around_the_blocks_in_graphs():
    """GPT2Model.forward has cells (transformers 5's output-recording wrappers); each
    block with a hook is called at a graph break, and the forward resumes after it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2Model(config).eval()
    calls = []
    for block in model.h:
        block.register_forward_hook(lambda m, args, out: calls.append(m))
    batches = [torch.randint(0, 128, (2, 8)) for _ in range(2)]
    with torch.no_grad():  # eager first: what its first call sets up is not a recompile
        expected = [model(input_ids=ids).last_hidden_state for ids in batches]
    backend = Recorder()
    captured = capture(model, backend)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", RuntimeWarning)
        for ids, want in zip(batches, expected, strict=True):
            torch.testing.assert_close(captured(input_ids=ids).last_hidden_state, want)
    assert len(calls) == 8, "each block's hook ran in the captured and the eager calls"
    # embeddings before the first block, each block's forward, the final norm after them
    sources = [g.meta["kiln_input_sources"] for g in backend.graphs]
    assert len(backend.graphs) == 4
    assert "self._modules['wte']._parameters['weight']" in sources[0]
    assert "self._modules['ln_f']._parameters['weight']" in sources[-1]


class Doubling(torch.nn.Module):
    def forward(self, x):
        return x * 2


class SuperAcrossBreaks(Doubling):
    """``super()`` reads the ``__class__`` cell, a free variable passed on to each resume."""

    def forward(self, x):
        y = x + 1
        print(end="")
        z = super().forward(y)
        total = lambda: z + y  # noqa: E731
        try:
            print(end="")
            w = total()
        except ValueError:
            w = y
        return super().forward(w)


def test_a_method_using_super_resumes_with_its_class_cell():
    assert len(graphs_of_two_calls(SuperAcrossBreaks(), (3,))) == 3
