"""Helpers to test a codegen against eager: trace a function to a functional aten graph,
compile it, run it and compare.

Code generators (kiln-cpp, kiln-triton) run the same checks with their own ``codegen``:
``check_against_eager`` for one function, ``check_samples`` for many at once (compiled as
one graph), the op table in ``kiln_loopir.testing.cases`` and PyTorch's OpInfo samples
through ``kiln_loopir.testing.opinfo``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from kiln_loopir.compile import CompiledGraph, compile_fx

__all__ = [
    "trace_aten",
    "compile_fn",
    "check_against_eager",
    "compile_symbolic",
    "check_sizes",
    "compare_outputs",
    "check_samples",
    "Sample",
    "SampleResult",
    "tolerances",
]


def trace_aten(fn: Callable, inputs: Sequence[object], *, dynamic: bool = False):
    """``fn`` as a functional aten FX graph with fake-tensor metadata, as kiln-autograd
    hands it over: functionalized, decomposed to torch's core aten set."""
    from torch.func import functionalize

    mode = "symbolic" if dynamic else "fake"
    table = core_aten_decompositions()
    first = make_fx(functionalize(fn, remove="mutations"), tracing_mode=mode,
                    decomposition_table=table)(*inputs)  # fmt: skip
    # Some decompositions use in-place ops; functionalize once more to remove them.
    interpreter = torch.fx.Interpreter(first)
    return make_fx(
        functionalize(lambda *args: interpreter.run(*args), remove="mutations"),
        tracing_mode=mode,
        decomposition_table=table,
    )(*inputs)


def compile_fn(
    fn: Callable, inputs: Sequence[object], *, codegen: object = "reference", dynamic=False, **kw
) -> CompiledGraph:
    """Trace ``fn`` on ``inputs`` and compile it (with the reference codegen by default)."""
    return compile_fx(trace_aten(fn, inputs, dynamic=dynamic), list(inputs), codegen=codegen, **kw)


def compile_symbolic(
    fn: Callable, inputs: Sequence[object], *, codegen: object = "reference", **kw
) -> CompiledGraph:
    """Trace ``fn`` with every size a symbol and compile it from the graph's own fake
    inputs, as kiln-autograd hands a graph over under dynamic shapes: no real tensor to
    read a size from, only the ShapeEnv's hints. The result runs at every size."""
    gm = trace_aten(fn, inputs, dynamic=True)
    fakes = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    return compile_fx(gm, fakes, codegen=codegen, **kw)


def check_sizes(
    fn: Callable,
    make_inputs: Callable[[int], Sequence[object]],
    sizes: Sequence[int],
    *,
    codegen: object = "reference",
    **kw,
) -> CompiledGraph:
    """Compile ``fn`` once with symbolic sizes (:func:`compile_symbolic`, traced on
    ``make_inputs(sizes[0])``) and check it against eager on fresh ``make_inputs(n)`` for
    every ``n`` in ``sizes``."""
    compiled = compile_symbolic(fn, make_inputs(sizes[0]), codegen=codegen, **kw)
    for n in sizes:
        inputs = list(make_inputs(n))
        compare_outputs(_flat(compiled(*inputs)), _flat(fn(*inputs)))
    return compiled


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    """Comparison tolerances for a result dtype (loose for low-precision floats)."""
    if dtype == torch.bfloat16:  # torch.testing's own rtol: two roundings apart (eager
        return {"atol": 1e-2, "rtol": 1.6e-2}  # rounds between ops, a fused kernel once)
    if dtype == torch.float16:
        return {"atol": 1e-2, "rtol": 1e-2}
    if dtype in (torch.float32, torch.complex64):
        return {"atol": 1e-5, "rtol": 1.3e-5}
    return {"atol": 1e-7, "rtol": 1e-7}


def _flat(value: object) -> list[object]:
    if isinstance(value, (tuple, list)):
        return [y for x in value for y in _flat(x)]
    return [value]


def check_against_eager(
    fn: Callable,
    inputs: Sequence[object],
    *,
    codegen: object = "reference",
    dynamic: bool = False,
    check_strides: bool = True,
    run_inputs: Sequence[object] | None = None,
    **kw,
) -> CompiledGraph:
    """Compile ``fn`` on ``inputs``, run it on ``run_inputs`` (default: the same inputs)
    and assert each output matches eager in value, dtype, size and (where eager's layout is
    dense) stride."""
    compiled = compile_fn(fn, inputs, codegen=codegen, dynamic=dynamic, **kw)
    run_inputs = list(inputs if run_inputs is None else run_inputs)
    expected = _flat(fn(*run_inputs))
    compare_outputs(_flat(compiled(*run_inputs)), expected, check_strides=check_strides)
    return compiled


def compare_outputs(
    actual: Sequence[object], expected: Sequence[object], *, check_strides: bool = True
) -> None:
    """Assert flat outputs match eager's in value, dtype, size and (where eager's layout is
    dense and ``check_strides``) stride."""
    assert len(actual) == len(expected), (len(actual), len(expected))
    for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if not isinstance(want, torch.Tensor):
            assert got == want, f"output {i}: {got!r} != {want!r}"
            continue
        assert isinstance(got, torch.Tensor), f"output {i}: {type(got).__name__}, not a tensor"
        assert got.dtype == want.dtype, f"output {i}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, (
            f"output {i}: size {tuple(got.shape)} != {tuple(want.shape)}"
        )
        torch.testing.assert_close(got, want, equal_nan=True, **tolerances(want.dtype))
        if check_strides and (
            want.is_contiguous() or want.is_contiguous(memory_format=torch.channels_last)
        ):
            for n, g, w in zip(got.shape, got.stride(), want.stride(), strict=True):
                assert n <= 1 or g == w, f"output {i}: stride {got.stride()} != {want.stride()}"


@dataclass
class Sample:
    """A function and the inputs to check it on; ``check_strides`` as in ``compare_outputs``."""

    name: str
    fn: Callable
    inputs: list[object]
    check_strides: bool = True


@dataclass
class SampleResult:
    """How one sample went: ``error`` is None when it matched eager; ``unsupported`` when
    the error is a ``NotImplementedError`` (a limitation said clearly, not a wrong value);
    ``eager_error`` when eager itself refused the sample (nothing to compare)."""

    sample: Sample
    error: BaseException | None = None
    eager_error: BaseException | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and self.eager_error is None

    @property
    def unsupported(self) -> bool:
        return isinstance(self.error, NotImplementedError)


def check_samples(
    samples: Sequence[Sample], *, codegen: object = "reference", batch: bool = True, **kw
) -> list[SampleResult]:
    """Check every sample against eager and return one result per sample.

    With ``batch`` the samples eager accepts are compiled together as one graph (one
    compile for the lot); if that graph fails as a whole, each sample is compiled alone, so
    that every error names its own sample."""
    results = [SampleResult(s) for s in samples]
    expected: dict[int, list[object]] = {}
    for k, s in enumerate(samples):
        try:
            expected[k] = _flat(s.fn(*s.inputs))
        except Exception as exc:
            results[k].eager_error = exc
    todo = list(expected)
    if batch and len(todo) > 1:
        try:
            outs = _run_batched([samples[k] for k in todo], **kw, codegen=codegen)
        except Exception:
            outs = None
        if outs is not None and len(outs) == sum(len(expected[k]) for k in todo):
            start = 0
            for k in todo:
                stop = start + len(expected[k])
                try:
                    _compare_sample(samples[k], outs[start:stop], expected[k])
                except AssertionError as exc:
                    results[k].error = exc
                start = stop
            # a mismatch may come from a neighbour sharing the kernel: confirm it alone
            todo = [k for k in todo if results[k].error is not None]
    for k in todo:
        s = samples[k]
        try:
            compiled = compile_fn(s.fn, s.inputs, codegen=codegen, **kw)
            _compare_sample(s, _flat(compiled(*s.inputs)), expected[k])
            results[k].error = None
        except Exception as exc:
            results[k].error = exc
    return results


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _compare_sample(sample: Sample, actual: list[object], expected: list[object]) -> None:
    """``compare_outputs``; for float16/bfloat16 inputs a result that misses eager's but
    matches eager computed in float32 (then rounded) passes too: kernels compute half types
    in float, where eager's own kernels may round (or overflow) in between."""
    try:
        compare_outputs(actual, expected, check_strides=sample.check_strides)
        return
    except AssertionError as exc:
        first = exc
    upcast = [_to_float32(t) for t in sample.inputs]
    if all(u is t for u, t in zip(upcast, sample.inputs, strict=True)):
        raise first
    try:
        reference = _flat(sample.fn(*upcast))
        reference = [
            r.to(e.dtype) if isinstance(r, torch.Tensor) and isinstance(e, torch.Tensor) else r
            for r, e in zip(reference, expected, strict=False)
        ]
        compare_outputs(actual, reference, check_strides=False)
    except Exception:
        raise first from None


def _to_float32(t: object) -> object:
    if isinstance(t, torch.Tensor) and t.dtype in _LOW_PRECISION:
        return t.to(torch.float32)
    return t


def _run_batched(samples: Sequence[Sample], **kw) -> list[object]:
    spans, inputs = [], []
    for s in samples:
        spans.append((len(inputs), len(inputs) + len(s.inputs)))
        inputs += s.inputs

    def batched(*tensors):
        return tuple(s.fn(*tensors[a:b]) for s, (a, b) in zip(samples, spans, strict=True))

    return _flat(compile_fn(batched, inputs, **kw)(*inputs))
