"""torch's profiler context managers (record_function, profile) in captured code: entered and
left natively around compiled graphs, never traced or captured as functions of their own.
(The break at a method load that crashed record_function's captured ``__exit__`` is in the
corpus: graph_breaks-break_at_method_load.)"""

import os
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from kiln_capture import capture

HERE = os.path.abspath(__file__)


class RunCounter:
    """A backend that keeps each graph and counts the runs of its compiled form."""

    def __init__(self):
        self.graphs = []
        self.runs = 0

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)

        def run(*args):
            self.runs += 1
            return gm.forward(*args)

        return run

    def ops(self) -> list[list[str]]:
        """The names of each graph's calls (``sin`` for ``x.sin()``, ``add`` for ``x + 1``)."""
        return [
            [
                getattr(node.target, "__name__", node.target)
                for node in gm.graph.nodes
                if is_op(node)
            ]
            for gm in self.graphs
        ]

    def op_names(self) -> set[str]:
        return {name for graph in self.ops() for name in graph}


def is_op(node) -> bool:
    return node.op in ("call_function", "call_method")


def callee_files(captured) -> set[str]:
    """The files of every function captured at a graph break or as a resume function."""
    return {c.fn.__code__.co_filename for c in captured.callees.values()}


def check_against_eager(fn, calls=3, **capture_kwargs):
    backend = RunCounter()
    captured = capture(fn, backend, **capture_kwargs)
    for _ in range(calls):
        x = torch.randn(8)
        torch.testing.assert_close(captured(x), fn(x))
    return captured, backend


# --- record_function around a break ----------------------------------------------------


def item_break(t):
    return t + t.sum().item()


def print_break(t):
    print("inside the range")
    return t


def opaque_break(t):
    return t + len(os.getcwd()) * 0


@pytest.mark.parametrize(
    "record_function",
    [torch.autograd.profiler.record_function, torch.profiler.record_function],
    ids=["autograd.profiler", "profiler"],
)
@pytest.mark.parametrize("brk", [item_break, print_break, opaque_break], ids=lambda f: f.__name__)
def test_record_function_around_a_break_compiles_both_sides(record_function, brk, capsys):
    def fn(x):
        y = x.sin() + 1
        with record_function("region"):
            z = brk(y * 2)
            z = z.tanh()
        return z.cos() + 3

    captured, backend = check_against_eager(fn)
    assert {"sin", "mul", "tanh", "cos"} <= backend.op_names()
    assert backend.runs >= 3 * 3, "before the range, inside it and after it are compiled"
    assert callee_files(captured) == {HERE}, "nothing of torch's profiler is captured"


def no_break(x):
    y = x.sin() + 1
    with torch.profiler.record_function("region"):
        z = (y * 2).tanh()
    return z.cos()


def test_record_function_without_a_break_splits_the_graph_at_its_range():
    captured, backend = check_against_eager(no_break)
    assert backend.ops() == [["sin", "add"], ["mul", "tanh"], ["cos"]]
    assert backend.runs == 3 * 3 and callee_files(captured) == {HERE}


def nested(x):
    y = x.sin()
    with torch.autograd.profiler.record_function("outer"):
        y = y * 2
        with torch.autograd.profiler.record_function("inner"):
            y = y.tanh()
            print("inside both ranges")
            y = y.exp()
        y = y - 1
    return y.cos()


def test_the_profiler_records_each_range_around_the_compiled_ops_inside_it(capsys):
    captured = capture(nested, RunCounter())
    captured(torch.randn(8))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        captured(torch.randn(8))
    parents = {
        e.name: e.cpu_parent.name if e.cpu_parent is not None else None for e in prof.events()
    }
    assert parents["outer"] is None and parents["inner"] == "outer"
    assert parents["aten::mul"] == "outer" and parents["aten::sub"] == "outer"
    assert parents["aten::tanh"] == "inner" and parents["aten::exp"] == "inner"
    assert parents["aten::sin"] is None and parents["aten::cos"] is None
    assert [e.name for e in prof.events()].count("inner") == 1


@torch.profiler.record_function("decorated")
def decorated(y):
    z = y * 2
    print("inside the decorated function")
    return z.tanh()


def calls_decorated(x):
    return decorated(x.sin()).cos()


def test_a_function_decorated_with_record_function_compiles(capsys):
    captured, backend = check_against_eager(calls_decorated)
    assert {"sin", "mul", "tanh", "cos"} <= backend.op_names()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        captured(torch.randn(8))
    assert [e.name for e in prof.events()].count("decorated") == 1


RANGE = torch.autograd.profiler.record_function("made outside")


def enters_a_range_made_outside(x):
    y = x.sin()
    with RANGE as entered:
        y = y * 2
    return y + len(entered.name)


def test_a_record_function_made_outside_the_frame_is_entered_natively():
    captured, backend = check_against_eager(enters_a_range_made_outside)
    assert {"sin", "mul"} <= backend.op_names() and callee_files(captured) == {HERE}


def raises_inside_the_range(x):
    y = x.sin()
    try:
        with torch.autograd.profiler.record_function("raising"):
            y = y * 2
            print("about to raise")
            raise ValueError(f"rejected {y.shape[0]}")
    except ValueError as err:
        y = y + len(str(err))
    return y


# the code after the raise runs eagerly (an exception made during capture is not rebuilt)
@pytest.mark.filterwarnings("ignore:kiln-capture runs raises_inside_the_range:RuntimeWarning")
def test_an_exception_leaves_the_range_as_it_does_eagerly(capsys):
    check_against_eager(raises_inside_the_range)
    captured = capture(raises_inside_the_range, RunCounter())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x = torch.randn(8)
        torch.testing.assert_close(captured(x), raises_inside_the_range(x))
    assert [e.name for e in prof.events()].count("raising") == 2


def profiles_itself(x):
    y = x.sin()
    with torch.profiler.profile() as prof:
        y = y * 2
    return y + (len(prof.key_averages()) > 0)


def test_a_profiler_started_inside_the_frame_runs_natively():
    captured, backend = check_against_eager(profiles_itself)
    assert {"sin", "mul"} <= backend.op_names() and callee_files(captured) == {HERE}


# --- the process survives ----------------------------------------------------------------

DDP_SHAPED = """
import torch
from torch.profiler import ProfilerActivity, profile
from kiln_capture import capture
from test_profiler_ranges import RunCounter

class Wrapper(torch.nn.Module):  # DistributedDataParallel.forward's shape
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.autograd.profiler.record_function("Wrapper.forward"):
            print("a graph break inside the range")
            return self.inner(x).relu()

model = Wrapper()
backend = RunCounter()
captured = capture(model, backend)
for _ in range(2):
    x = torch.randn(3, 4)
    torch.testing.assert_close(captured(x), model(x))
assert backend.runs >= 2 and "relu" in backend.op_names()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    captured(torch.randn(3, 4))
assert any(e.name == "Wrapper.forward" for e in prof.events())
print("survived")
"""


def test_capturing_record_function_under_the_profiler_does_not_crash_the_process():
    # a crash here is a failed test, not the end of the test run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", DDP_SHAPED],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr[-3000:]
