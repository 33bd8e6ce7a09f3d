"""Dynamic shapes end to end: a new size of a known family reuses the kernels it has.

Each test counts lowerings (kiln-loopir's ``compile_fx``: lowering, scheduling and kernel
generation of one aten graph) and compares every call with eager on fresh random inputs,
with warnings as errors: a graph that ran eagerly instead would warn.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import symbolic

import kiln
import kiln.pipeline
from kiln.cache import graph_key

BATCHES = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]


pytestmark = pytest.mark.usefixtures("own_cache", "warnings_are_errors")


def _check_calls(fn, compiled, inputs_per_call) -> None:
    for inputs in inputs_per_call:
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))


def sin_softmax(x):
    return (x.sin() * 2).softmax(-1)


def test_pointwise_and_softmax_lower_once_for_every_batch_size(lowerings, tmp_path):
    compiled = kiln.compile(sin_softmax, dynamic=True, options={"debug_dir": str(tmp_path)})
    _check_calls(sin_softmax, compiled, [[torch.randn(b, 32)] for b in BATCHES])
    assert lowerings == [True]
    # the sizes are the kernel's arguments, bound from the inputs by the host program
    kernels = (tmp_path / "frame000" / "forward_kernels.cpp").read_text()
    assert "int64_t s" in kernels


@pytest.mark.parametrize(("dynamic", "expected"), [(True, [True]), (None, [False, True])])
def test_softmax_over_a_dynamic_row_length(lowerings, dynamic, expected):
    def fn(x):
        return torch.softmax(x * 3, -1) + x.amax(-1, keepdim=True)

    compiled = kiln.compile(fn, dynamic=dynamic)
    rows = [3, 5, 7, 8, 16, 17, 33, 100]  # odd, powers of two and neither
    _check_calls(fn, compiled, [[torch.randn(4, n)] for n in rows])
    assert lowerings == expected  # dynamic=None: the first size alone, then its family


def slice_expand(x):
    return x[1:].unsqueeze(1).expand(-1, 3, -1).sum((0, 2))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: (x * 2).reshape(-1, 8).sum(1),
        lambda x: x.view(x.shape[0] * 2, -1).softmax(-1) + 1,
        lambda x: x.transpose(0, 1).flatten().cos(),
        slice_expand,
    ],
    ids=["reshape", "view_of_a_size_expression", "transpose_flatten", "slice_expand"],
)
def test_views_whose_sizes_are_expressions(lowerings, fn):
    compiled = kiln.compile(fn, dynamic=True)
    _check_calls(fn, compiled, [[torch.randn(b, 16)] for b in [3, 5, 8, 13, 2]])
    # x[1:] of 2 rows has 1 row, which expand treats apart: a guard sends that size to a
    # graph of its own (2 rows, any width); the others share one
    assert lowerings == ([True, True] if fn is slice_expand else [True])


def attention_scores(q, k):
    return (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1)


def rotary_frequencies(x):
    n = x.shape[-1]
    freqs = 1.0 / 10000 ** (torch.arange(0, n, 2, dtype=torch.float32) / n)
    return x * freqs.repeat(2)


# sizes past polynomials: FloatPow(ToFloat(s0), -0.5), OpaqueUnaryFn_sqrt, CeilToInt of an
# IntTrueDiv, the IntTrueDiv of two sizes, TruncToInt of a float product; and positions
# divided by a size, as rotary embeddings compute them
@pytest.mark.parametrize(
    ("fn", "make_inputs"),
    [
        (attention_scores, lambda n: [torch.randn(2, 5, n), torch.randn(2, 7, n)]),
        (lambda x: x / math.sqrt(x.shape[-1]) + 1, lambda n: [torch.randn(3, n)]),
        (lambda x: x[:, : math.ceil(x.shape[1] / 3)] * 2, lambda n: [torch.randn(3, n)]),
        (lambda x: x * (x.shape[0] / x.shape[1]), lambda n: [torch.randn(n + 2, n)]),
        (lambda x: x[:, : int(x.shape[1] * 0.5 + 1)].exp(), lambda n: [torch.randn(3, n)]),
        (rotary_frequencies, lambda n: [torch.randn(3, 2 * n)]),
    ],
    ids=["attention_scale", "sqrt", "ceil_of_a_quotient", "ratio", "int_of_a_float", "rope"],
)
def test_float_functions_of_sizes_run_as_generated_code(lowerings, tmp_path, fn, make_inputs):
    """No ATen fallback (it would warn): the kernels and the host program print these
    sizes, and one lowering serves every size."""
    compiled = kiln.compile(fn, dynamic=True, options={"debug_dir": str(tmp_path)})
    _check_calls(fn, compiled, [make_inputs(n) for n in [4, 5, 7, 8, 13]])
    assert lowerings == [True]
    if fn is attention_scores:  # the scale is computed in doubles from the size argument
        kernels = (tmp_path / "frame000" / "forward_kernels.cpp").read_text()
        assert "std::pow(static_cast<double>(s" in kernels


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10), torch.nn.Softmax(-1)
    )


def test_mlp_inference_lowers_once_per_size_family(lowerings):
    model = mlp()
    compiled = kiln.compile(model)  # dynamic=None: symbolic after the first new size
    with torch.no_grad():
        _check_calls(model, compiled, [[torch.randn(b, 32)] for b in [2, 3, 4, 5, 6, 7]])
    assert lowerings == [False, True]


def test_mlp_training_lowers_forward_and_backward_once_per_size_family(lowerings):
    model, reference = mlp(), mlp()
    compiled = kiln.compile(model)
    for b in [2, 3, 4, 5, 6, 7]:
        x = torch.randn(b, 32, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        out, expected = compiled(x), reference(x_ref)
        torch.testing.assert_close(out, expected)
        weight = torch.randn_like(expected)
        (out * weight).sum().backward()
        (expected * weight).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        for p, p_ref in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, p_ref.grad)
    # forward and backward of the first size, then of the family
    assert lowerings == [False, False, True, True]


def test_a_size_of_one_gets_its_own_graph(lowerings):
    # capture guards a dimension marked dynamic that the trace fixed to 1 on that size
    model = mlp()
    compiled = kiln.compile(model)
    with torch.no_grad():
        _check_calls(model, compiled, [[torch.randn(b, 32)] for b in [4, 1, 8, 1, 5]])
    assert lowerings == [False, False, True]


def test_the_cache_key_tells_symbolic_sizes_from_static_ones(lowerings, monkeypatch, tmp_path):
    keys: list[tuple[bool, str]] = []

    def recording(gm, example_inputs, codegen, settings):
        key = graph_key(gm, example_inputs, codegen, settings)
        keys.append((symbolic(example_inputs), key))
        return key

    monkeypatch.setattr(kiln.pipeline, "graph_key", recording)
    options = {"cache_dir": str(tmp_path)}
    compiled = kiln.compile(sin_softmax, options=options)
    _check_calls(sin_softmax, compiled, [[torch.randn(b, 32)] for b in [2, 3, 4]])
    (static, static_key), (dynamic, symbolic_key) = keys
    assert (static, dynamic) == (False, True) and static_key != symbolic_key
    assert lowerings == [False, True]
    # a new process (here: after reset) whose family starts at other sizes finds its graph
    kiln.reset()
    compiled = kiln.compile(sin_softmax, options=options)
    _check_calls(sin_softmax, compiled, [[torch.randn(b, 32)] for b in [7, 9, 11]])
    assert keys[-1] == (True, symbolic_key)
    assert lowerings == [False, True, False], "the family's graph loaded, not lowered again"


# --- torch functions given symbolic sizes, and Python's rounding of sizes -----------------


def interpolate_to_twice(x):
    return torch.nn.functional.interpolate(x, size=(x.shape[-1] * 2,)) + 1


def interpolate_nearest(x):
    return torch.nn.functional.interpolate(x, scale_factor=2.0) * 2


def interpolate_bilinear(x):
    return torch.nn.functional.interpolate(x, scale_factor=1.5, mode="bilinear").relu()


def rounded_slices(x):
    n = x.shape[-1]
    head = x[..., : round(n * 0.7)] * float(n)
    return head.sum(-1) + x[..., : int(n * 0.5)].sum(-1) + x[..., math.floor(n * 0.3) :].sum(-1)


@pytest.mark.parametrize(
    ("fn", "make_input"),
    [
        (interpolate_to_twice, lambda n: torch.randn(2, 3, n)),
        (interpolate_nearest, lambda n: torch.randn(2, 3, n)),
        (interpolate_bilinear, lambda n: torch.randn(1, 2, n, n + 3)),
        (rounded_slices, lambda n: torch.randn(3, n)),
    ],
    ids=["interpolate_to_a_size_expression", "interpolate_nearest", "bilinear", "rounding"],
)
@pytest.mark.parametrize("dynamic", [True, None])
def test_sizes_computed_by_python_and_interpolate_lower_once(lowerings, fn, make_input, dynamic):
    """A size list of expressions, a scale factor's output size and sizes rounded by
    Python's ``round``/``int``/``math.floor`` stay symbolic: one lowering for every size
    (after the first, when ``dynamic=None`` makes them symbolic on the first new size)."""
    compiled = kiln.compile(fn, dynamic=dynamic)
    _check_calls(fn, compiled, [[make_input(n)] for n in [5, 6, 9, 15, 16]])
    assert lowerings == ([True] if dynamic else [False, True])


@pytest.mark.parametrize(
    ("output_size", "make_input"),
    [
        ((3, 3), lambda n: torch.randn(2, 3, n, n + 2)),
        ((7, 5), lambda n: torch.randn(2, 3, n, 2 * n)),
        (1, lambda n: torch.randn(2, 4, n, n + 1)),
        ((None, 2), lambda n: torch.randn(3, n, n + 1)),
    ],
    ids=["3x3", "7x5", "global", "none_keeps_a_size"],
)
def test_adaptive_avg_pool2d_lowers_once_for_every_size(lowerings, output_size, make_input):
    """torch's decomposition picks its form by the sizes (divisible or not, the longest
    window), a guard each; Kiln's is two products with window-averaging matrices.
    (torch.compile's inductor lowering fixes every size: one graph per size.)"""

    def fn(x):
        return torch.nn.functional.adaptive_avg_pool2d(x, output_size) * 2

    compiled = kiln.compile(fn, dynamic=True)
    # smaller than the output, divisible by it and not, windows of one and of two lengths
    _check_calls(fn, compiled, [[make_input(n)] for n in [2, 6, 7, 9, 12, 14]])
    assert lowerings == [True]


def test_adaptive_avg_pool2d_trains_with_one_forward_and_backward(lowerings):
    def fn(x):
        return torch.nn.functional.adaptive_avg_pool2d(x, (3, 3)).sin()

    compiled = kiln.compile(fn, dynamic=True)
    for n in [5, 7, 9, 14]:
        x = torch.randn(2, 3, n, n + 1, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        out, expected = compiled(x), fn(x_ref)
        torch.testing.assert_close(out, expected)
        weight = torch.randn_like(expected)
        (out * weight).sum().backward()
        (expected * weight).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
    assert lowerings == [True, True]


def _at_offset(n: int, offset: int) -> torch.Tensor:
    """A (2, n, 8) tensor that starts ``offset`` elements into a larger storage."""
    return torch.randn(offset + 16 * n + 16)[offset : offset + 16 * n].view(2, n, 8)


def cache_update(k, x):
    return torch.cat([k, x], dim=1).sin() * 2


def test_an_input_at_an_offset_runs_the_graph_of_its_family(lowerings):
    # a key/value cache that comes as views at offsets into one block (a CUDA graph's fresh
    # outputs) runs the graph captured at offset 0, reading it where it starts
    compiled = kiln.compile(cache_update)
    calls = [[torch.randn(2, n, 8), torch.randn(2, 1, 8)] for n in (3, 4)]
    calls += [[_at_offset(n, 24 + n), torch.randn(2, 1, 8)] for n in (5, 6, 7)]
    _check_calls(cache_update, compiled, calls)
    assert lowerings == [False, True]  # the first size alone, then its family
