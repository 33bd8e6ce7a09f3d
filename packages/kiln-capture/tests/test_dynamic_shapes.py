"""Symbolic sizes: automatic dynamic after a size-caused recompile (every changed size at
once), ``dynamic=True``/``False``, ``mark_dynamic``/``mark_static``, Python's arithmetic on
sizes, the recompile reasons, and the warning of a function that runs eagerly."""

import math
import warnings

import pytest
import torch
from recording import Recorder

import kiln_capture
from kiln_capture import capture, mark_dynamic, mark_static


@pytest.fixture(autouse=True)
def no_warnings():
    """A graph that should run compiled but ran eagerly would warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def check(fn, compiled, inputs_per_call):
    for inputs in inputs_per_call:
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))


def is_symbolic(gm) -> bool:
    return any(
        isinstance(s, torch.SymInt)
        for node in gm.graph.nodes
        if node.op == "placeholder" and isinstance(node.meta["example_value"], torch.Tensor)
        for s in node.meta["example_value"].shape
    )


# --- Python's arithmetic on symbolic sizes ----------------------------------------


SIZE_ARITHMETIC = {
    "tuple_plus_size": lambda x: x.reshape((-1,) + x.shape[1:]) * 2,
    "size_plus_tuple": lambda x: x.view(x.shape[:-1] + (2, -1)).sum(-1),
    "size_plus_size": lambda x: x.new_zeros(x.shape[:1] + x.shape[1:]) + x,
    "list_of_size": lambda x: x.view(*list(x.shape[:-1]), 2, -1),
    "math_sqrt": lambda x: x / math.sqrt(x.shape[0]),
    "math_ceil": lambda x: x[: math.ceil(x.shape[0] / 2)] + 1,
    "int_float": lambda x: x * int(x.shape[0]) + float(x.shape[0]),
    "divmod": lambda x: x * divmod(x.shape[0], 3)[1],
    "len": lambda x: x * len(x),
    "range_of_min": lambda x: sum(x[i] for i in range(min(len(x), 2))),
    "compare_and_floordiv": lambda x: x[: x.shape[0] // 2] if x.shape[0] > 3 else x,
    "round": lambda x: x[: round(x.shape[0] * 0.7)] * 2,
    "round_to_digits": lambda x: x * round(x.shape[0] / 3, 1),
    "round_method": lambda x: x[: (x.shape[0] * 0.7).__round__()] + 1,
    "int_of_a_float": lambda x: x[: int(x.shape[0] * 0.5)] * 2,
    "floor_and_ceil_of_floats": lambda x: x[
        math.floor(x.shape[0] * 0.3) : math.ceil(x.shape[0] * 0.7)
    ],
    "float_method": lambda x: x * float(x.shape[0]).__floor__(),
}


@pytest.mark.parametrize("fn", SIZE_ARITHMETIC.values(), ids=SIZE_ARITHMETIC.keys())
def test_python_arithmetic_on_sizes_keeps_them_symbolic(fn):
    backend = Recorder()
    compiled = capture(fn, backend, fullgraph=True, dynamic=True)
    check(fn, compiled, [[torch.randn(n, 4)] for n in (5, 7, 8, 12)])
    assert len(backend.graphs) == 1 and is_symbolic(backend.graphs[0])


@pytest.mark.parametrize(
    "fn",
    [lambda x: x * math.log(x.shape[0]), lambda x: x * float(x.shape[0]).is_integer()],
    ids=["math_log", "is_integer"],
)
def test_a_function_with_no_symbolic_version_guards_the_size_in_one_graph(fn):
    """torch has no symbolic ``log`` or ``is_integer``: the size's value is guarded (as
    torch.compile does) and the function stays one graph."""
    backend = Recorder()
    compiled = capture(fn, backend, fullgraph=True, dynamic=True)
    check(fn, compiled, [[torch.randn(n, 4)] for n in (5, 7, 5)])
    assert len(backend.graphs) == 2, "one graph per size"


def test_a_size_in_a_string_is_its_value_guarded():
    def fn(x):
        return x * len(f"{x.shape[0]}")

    backend = Recorder()
    compiled = capture(fn, backend, fullgraph=True, dynamic=True)
    check(fn, compiled, [[torch.randn(n, 4)] for n in (5, 7, 5)])
    assert len(backend.graphs) == 2, "one graph per value the string was made of"


# --- torch functions given symbolic sizes -----------------------------------------


def interpolate_to_twice(x):
    return torch.nn.functional.interpolate(x, size=(x.shape[-1] * 2,))


def interpolate_bilinear(x):
    return torch.nn.functional.interpolate(x, scale_factor=1.5, mode="bilinear")


@pytest.mark.parametrize(
    ("fn", "make_input"),
    [
        (interpolate_to_twice, lambda n: torch.randn(2, 3, n)),
        (
            lambda x: torch.nn.functional.interpolate(x, scale_factor=2.0),
            lambda n: torch.randn(1, 2, n),
        ),
        (interpolate_bilinear, lambda n: torch.randn(1, 2, n, n + 3)),
        (
            lambda x: torch.nn.functional.adaptive_avg_pool2d(x, (3, 2)),
            lambda n: torch.randn(2, n, n + 1),
        ),
    ],
    ids=[
        "interpolate_to_a_size_expression",
        "interpolate_nearest_scale",
        "interpolate_bilinear_scale",
        "adaptive_avg_pool2d",
    ],
)
def test_torch_functions_given_symbolic_sizes_trace_with_them(fn, make_input):
    """torch's Python decompositions run where the C++ composites take concrete sizes only
    (``upsample_nearest1d.vec``) or fix them with guards: one graph, symbolic output."""
    backend = Recorder()
    compiled = capture(fn, backend, fullgraph=True, dynamic=True)
    check(fn, compiled, [[make_input(n)] for n in (5, 6, 9, 16)])
    (gm,) = backend.graphs
    (out,) = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert any(isinstance(s, torch.SymInt) for s in out.meta["example_value"].shape)


def test_interpolate_after_an_automatic_dynamic_recompile():
    backend = Recorder()
    compiled = capture(interpolate_to_twice, backend)
    check(interpolate_to_twice, compiled, [[torch.randn(2, 3, n)] for n in (5, 6, 9, 16)])
    assert len(backend.graphs) == 2 and is_symbolic(backend.graphs[1])


# --- automatic dynamic --------------------------------------------------------------


class Cache:
    def __init__(self, n):
        self.keys = [torch.randn(2, n, 4) for _ in range(3)]
        self.values = [torch.randn(2, n, 4) for _ in range(3)]


def attend(q, cache):
    out = q
    for k, v in zip(cache.keys, cache.values, strict=True):
        out = out + (q @ k.transpose(-1, -2)).softmax(-1) @ v
    return out


def test_every_size_that_changed_becomes_symbolic_in_one_recompile():
    backend = Recorder()
    compiled = capture(attend, backend)
    check(attend, compiled, [[torch.randn(2, 1, 4), Cache(n)] for n in (3, 4, 5, 6, 7)])
    assert len(backend.graphs) == 2, "one capture per size, then one for the family"
    assert is_symbolic(backend.graphs[1])
    (failed,) = compiled.stats.recompile_failures
    assert len(failed) == 6, "the six cache tensors, not only the first that failed"
    (made,) = compiled.stats.made_dynamic
    assert made == [f"cache.{name}[{i}].size(1)" for name in ("keys", "values") for i in range(3)]


def test_a_recompile_reason_has_the_old_and_the_new_value():
    backend = Recorder()
    compiled = capture(lambda x, n: x.sum(0) * n, backend, dynamic=False)
    compiled(torch.randn(3, 2), 2)
    compiled(torch.randn(4, 2), 5)
    (failed,) = compiled.stats.recompile_failures
    assert failed[0].startswith("x: Tensor(float32, cpu, size=(3, 2)")
    assert ", now Tensor(float32, cpu, size=(4, 2)" in failed[0]
    assert failed[1] == "n == 2, now 5"
    assert compiled.stats.recompile_reasons == ["; ".join(failed)]
    assert compiled.stats.made_dynamic == [[]], "dynamic=False makes nothing symbolic"


def test_dynamic_false_never_makes_a_size_symbolic():
    backend = Recorder()
    compiled = capture(lambda x: x.softmax(-1), backend, dynamic=False)
    check(lambda x: x.softmax(-1), compiled, [[torch.randn(n, 3)] for n in (2, 3, 4)])
    assert len(backend.graphs) == 3 and not any(is_symbolic(g) for g in backend.graphs)


def test_an_int_read_from_an_attribute_stays_a_constant():
    class Config:
        heads = 2

    config = Config()

    def fn(x):
        return x.view(config.heads, -1) * config.heads

    backend = Recorder()
    compiled = capture(fn, backend)
    check(fn, compiled, [[torch.randn(8)]])
    config.heads = 4
    check(fn, compiled, [[torch.randn(8)]])
    config.heads = 8
    check(fn, compiled, [[torch.randn(8)]])
    assert len(backend.graphs) == 3 and compiled.stats.made_dynamic == [[], []]


# --- dynamic=True -----------------------------------------------------------------


def test_dynamic_true_makes_what_the_call_passes_symbolic_but_not_parameters():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 4)

    def fn(x, cache):
        return linear(x) + attend(x, cache)

    backend = Recorder()
    compiled = capture(fn, backend, dynamic=True)
    check(fn, compiled, [[torch.randn(2, 1, 4), Cache(n)] for n in (3, 4, 9)])
    (gm,) = backend.graphs
    placeholders = {
        n.meta["source"]: n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"
    }
    assert isinstance(placeholders["cache.keys[0]"].shape[1], torch.SymInt)
    weight = next(v for k, v in placeholders.items() if k.endswith("['weight']"))
    assert not any(isinstance(s, torch.SymInt) for s in weight.shape)


# --- mark_dynamic / mark_static -------------------------------------------------------


def test_mark_dynamic_makes_a_dimension_symbolic_from_the_first_call():
    backend = Recorder()
    compiled = capture(lambda x: x.sum(0), backend)
    inputs = [[mark_dynamic(torch.randn(n, 3), 0)] for n in (4, 5)] + [[torch.randn(6, 3)]]
    check(lambda x: x.sum(0), compiled, inputs)
    assert len(backend.graphs) == 1 and is_symbolic(backend.graphs[0])
    assert kiln_capture.mark_dynamic is mark_dynamic


def test_mark_dynamic_with_a_range_recompiles_outside_it():
    backend = Recorder()
    compiled = capture(lambda x: x.cos(), backend, dynamic=False)
    inputs = [[mark_dynamic(torch.randn(n, 3), 0, min=2, max=8)] for n in (4, 8, 3)]
    check(lambda x: x.cos(), compiled, [*inputs, [torch.randn(9, 3)]])
    assert len(backend.graphs) == 2, "9 is outside [2, 8]"
    guard = compiled.cache_entries()[-1].guard_source
    assert "x.size()[0] <= 8" in guard


def test_mark_dynamic_checks_its_arguments():
    with pytest.raises(ValueError, match="outside"):
        mark_dynamic(torch.randn(3, 2), 0, min=4)
    with pytest.raises(IndexError):
        mark_dynamic(torch.randn(3, 2), 2)


def test_mark_dynamic_on_a_dimension_the_code_fixes_warns():
    def fn(x):
        return x.view(4, 3) + 1

    compiled = capture(fn, Recorder())
    x = mark_dynamic(torch.randn(4, 3), 0)
    with pytest.warns(RuntimeWarning, match="mark_dynamic"):
        torch.testing.assert_close(compiled(x), fn(x))


def test_mark_static_keeps_a_dimension_static_with_dynamic_true():
    backend = Recorder()
    compiled = capture(lambda x: x.sum(1), backend, dynamic=True)
    check(lambda x: x.sum(1), compiled, [[mark_static(torch.randn(n, 5), 1)] for n in (3, 4)])
    (gm,) = backend.graphs
    (x,) = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(x.shape[0], torch.SymInt) and x.shape[1] == 5


def test_mark_static_wins_over_automatic_dynamic():
    backend = Recorder()
    compiled = capture(lambda x: x * 2, backend)
    check(lambda x: x * 2, compiled, [[mark_static(torch.randn(n))] for n in (2, 3, 4)])
    assert len(backend.graphs) == 3 and not any(is_symbolic(g) for g in backend.graphs)


# --- eager runs say so ------------------------------------------------------------


def test_a_function_that_runs_eagerly_says_so_once():
    def fn(x):  # a generator function: capture runs it eagerly
        yield x * 2 + 1

    compiled = capture(fn, Recorder())
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match=r"fn eagerly: generators and coroutines run"):
        torch.testing.assert_close(list(compiled(x)), list(fn(x)))
    torch.testing.assert_close(list(compiled(x)), list(fn(x)))  # no second warning (errors here)


def at_offset(n: int, offset: int) -> torch.Tensor:
    """A (2, n, 4) tensor that starts ``offset`` elements into a larger storage."""
    return torch.randn(offset + 8 * n + 16)[offset : offset + 8 * n].view(2, n, 4)


def grow(k, x):
    return torch.cat([k, x], dim=1).sin()


def test_an_input_at_an_offset_is_no_new_capture_where_the_graph_reads_no_offset():
    # (a CUDA graph's outputs come as views at offsets into one block: a key/value cache
    # fed back must not make generate() capture again)
    backend = Recorder()
    compiled = capture(grow, backend)
    calls = [[torch.randn(2, n, 4), torch.randn(2, 1, 4)] for n in (3, 4)]
    calls += [[at_offset(n, 40 + n), torch.randn(2, 1, 4)] for n in (5, 6)]
    check(grow, compiled, calls)
    assert len(backend.graphs) == 2, "one capture per size, then one for the family"


def offset_read(k):
    return k.sin() * k.storage_offset()


def placed_view(k):
    return torch.as_strided(k, (2, 3), (3, 1), 2).cos() + k.sum()


@pytest.mark.parametrize("fn", [offset_read, placed_view])
def test_a_graph_that_reads_offsets_is_guarded_on_them(fn):
    backend = Recorder()
    compiled = capture(fn, backend)
    calls = [[torch.randn(2, n, 4)] for n in (3, 4)] + [[at_offset(5, 7)], [at_offset(6, 9)]]
    check(fn, compiled, calls)
    assert len(backend.graphs) == 3, "a capture for the first offset that is not 0"
