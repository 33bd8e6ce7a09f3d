"""A graph break inside a `for` loop body: the loop steps natively between resume functions.

Models whose layers are modules with hooks (FSDP2's `fully_shard`ed layers) break the graph
at each layer's call; the code after the first one was run eagerly. Here it is captured once
for every layer that reaches it, the same with every iterator whose length is known and
small; any other keeps running eagerly, with a warning.
"""

import copy
import warnings

import pytest
import torch
from bytecode import Label, TryBegin

from kiln_capture import capture
from kiln_capture.codegen import Codegen
from kiln_capture.loop_breaks import MAX_NATIVE_STEPS, emit_native_step

LAYERS = 12


class RunCounting:
    """A backend that records its graphs and how often each compiled graph ran."""

    def __init__(self):
        self.graphs = []
        self.runs = []

    def __call__(self, gm, example_inputs):
        index = len(self.graphs)
        self.graphs.append(gm)
        self.runs.append(0)

        def run(*args):
            self.runs[index] += 1
            return gm.forward(*args)

        return run

    def runs_of(self, op: str) -> int:
        """How often the graphs whose code holds ``op`` ran."""
        return sum(n for gm, n in zip(self.graphs, self.runs, strict=True) if op in gm.code)


def hooked(layers, seen: list):
    """Each layer appends its index to ``seen`` when it runs (a hook, as FSDP2's are)."""
    for index, layer in enumerate(layers):
        layer.register_forward_hook(lambda module, args, out, index=index: seen.append(index))
    return layers


def no_eager_warning(record) -> None:
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert not messages, messages


def test_a_sequential_of_hooked_layers_resumes_after_each_layer():
    seen = []
    model = torch.nn.Sequential(*hooked([torch.nn.Linear(8, 8) for _ in range(LAYERS)], seen))
    eager = copy.deepcopy(model)  # capture gives the hooked layers their compiled calls
    backend = RunCounting()
    compiled = capture(model, backend)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for call in range(2):
            x = torch.randn(3, 8)
            seen.clear()
            got = compiled(x)
            assert seen == list(range(LAYERS)), "the hooks ran in order, once each"
            seen.clear()
            torch.testing.assert_close(got, eager(x))
            # one graph per layer's forward (each hooked module is captured on its own);
            # the loop between them has no op, and nothing is captured again
            assert len(backend.graphs) == LAYERS
            assert sum(backend.runs) == LAYERS * (call + 1)
    no_eager_warning(record)
    resumes = compiled._captured.callees.values()
    assert resumes and all(c.stats.eager_reason is None for c in resumes)
    assert all(c.stats.compiles == 1 for c in resumes), "one capture serves every layer"


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return (torch.relu(self.linear(x)),)


class Blocks(torch.nn.Module):
    """The loop of a Hugging Face model: code around each block's call."""

    def __init__(self, seen):
        super().__init__()
        self.h = torch.nn.ModuleList(hooked([Block() for _ in range(LAYERS)], seen))

    def forward(self, x):
        x = x * 2
        for index, block in enumerate(self.h):
            x = block(x)[0] + index
            x = x * 0.5
        return x.sum(-1)


def test_code_between_hooked_blocks_compiles_a_bounded_number_of_graphs():
    seen = []
    model = Blocks(seen)
    eager = copy.deepcopy(model)
    backend = RunCounting()
    compiled = capture(model, backend)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for call in range(2):
            x = torch.randn(3, 8)
            seen.clear()
            got = compiled(x)
            assert seen == list(range(LAYERS))
            seen.clear()
            torch.testing.assert_close(got, eager(x))
            # the blocks', before the loop, after each call (again once the index is an
            # input), after the loop
            assert len(backend.graphs) <= LAYERS + 5
            assert backend.runs_of("0.5") == LAYERS * (call + 1), "the body ran compiled"
    no_eager_warning(record)


class Collects(torch.nn.Module):
    def __init__(self, seen):
        super().__init__()
        self.layers = torch.nn.ModuleList(hooked([Block() for _ in range(4)], seen))

    def forward(self, x):
        outputs = []
        for layer in self.layers:
            outputs.append(layer(x + 1)[0])
            x = outputs[-1]
        return outputs


def test_each_layers_output_is_appended_to_the_list_the_frame_returns():
    seen = []
    model = Collects(seen)
    eager = copy.deepcopy(model)
    compiled = capture(model, RunCounting())
    for _ in range(2):
        x = torch.randn(3, 8)
        got, expected = compiled(x), eager(x)
        assert len(got) == len(expected) == 4
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b)


def accumulate(xs):
    y = xs[0] * 0
    for t in xs:
        y = y + t
        print("step")
    return y * 2


@pytest.mark.parametrize("count", [MAX_NATIVE_STEPS + 1, MAX_NATIVE_STEPS + 2, 200])
def test_only_a_loop_of_few_items_left_steps_natively(count, capsys):
    """Each item nests calls: at most MAX_NATIVE_STEPS are resumed one by one (the first
    is traced before the break); a longer loop runs its rest eagerly, as before."""
    fn = capture(accumulate, RunCounting())
    xs = [torch.randn(3) for _ in range(count)]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.testing.assert_close(fn(xs), accumulate(xs))
    eager = [str(w.message) for w in record if "items left" in str(w.message)]
    assert bool(eager) == (count - 1 > MAX_NATIVE_STEPS), eager


def test_a_later_call_with_a_longer_loop_runs_its_rest_eagerly(capsys):
    backend = RunCounting()
    fn = capture(accumulate, backend)
    short = [torch.randn(3) for _ in range(10)]
    torch.testing.assert_close(fn(short), accumulate(short))
    long = [torch.randn(3) for _ in range(100)]
    with pytest.warns(RuntimeWarning, match="the iterator has 99 items left"):
        torch.testing.assert_close(fn(long), accumulate(long))
    graphs = len(backend.graphs)
    short = [torch.randn(3) for _ in range(10)]
    torch.testing.assert_close(fn(short), accumulate(short))
    assert len(backend.graphs) == graphs, "the short loop's captures still serve it"


class Flaky:
    """An iterator that tells its length and raises at one position."""

    def __init__(self, items, fail_at):
        self.items, self.taken, self.fail_at = list(items), 0, fail_at

    def __iter__(self):
        return self

    def __length_hint__(self):
        return len(self.items) - self.taken

    def __next__(self):
        if self.taken == self.fail_at:
            raise ValueError(f"failed at {self.taken}")
        if self.taken == len(self.items):
            raise StopIteration
        self.taken += 1
        return self.items[self.taken - 1]


def scale_until_failure(x, items):
    y = x + 1
    try:
        for t in items:
            y = y * t
            print("step")
    except ValueError as err:
        y = y - len(str(err))
    return y


@pytest.mark.parametrize("fail_at", [0, 2, None])
def test_an_exception_from_the_iterator_reaches_the_handler_around_the_loop(fail_at, capsys):
    fn = capture(scale_until_failure, RunCounting())
    for _ in range(2):
        x, items = torch.randn(3), [torch.randn(3) for _ in range(4)]
        got = fn(x, Flaky(items, fail_at))
        torch.testing.assert_close(got, scale_until_failure(x, Flaky(items, fail_at)))


def generated(xs):
    yield from xs


def test_a_generator_of_unknown_length_runs_the_rest_eagerly(capsys):
    fn = capture(scale_until_failure, RunCounting())
    x, items = torch.randn(3), [torch.randn(3) for _ in range(3)]
    with pytest.warns(RuntimeWarning, match="an unknown number of items left"):
        got = fn(x, generated(items))
    torch.testing.assert_close(got, scale_until_failure(x, generated(items)))


def native_step_template(below, iterator):
    pass


def test_the_native_step_assembles_with_this_pythons_loop_exit():
    """FOR_ITER on a rebuilt stack, its exit label followed by what CPython skips there
    (3.12: END_FOR; 3.13: END_FOR, POP_TOP), inside a handler of the original's depth: the
    body gets (below, iterator, item), the exit (below,), the handler (below, exception)."""
    calls = []

    def resume(name):
        return lambda *stack: calls.append((name, stack)) or name

    cg = Codegen(native_step_template.__code__, {})
    cg.prologue()
    cg.load_local("below")
    cg.load_local("iterator")
    handler = TryBegin(Label(), False, stack_depth=1)
    emit_native_step(
        cg,
        handler,
        lambda: cg.call_resume(resume("body"), 3, []),
        lambda: cg.call_resume(resume("exit"), 1, []),
    )
    cg.emit(handler.target)
    cg.call_resume(resume("handler"), 2, [])
    step = type(native_step_template)(cg.to_code(), {})

    items = iter([7, 8])
    assert step("b", items) == "body" and calls[-1] == ("body", ("b", items, 7))
    assert step("b", iter(())) == "exit" and calls[-1] == ("exit", ("b",))
    assert step("b", Flaky([], fail_at=0)) == "handler"
    name, (below, error) = calls[-1]
    assert (name, below) == ("handler", "b") and isinstance(error, ValueError)
