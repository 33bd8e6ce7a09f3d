"""Helpers to test a codegen against eager: trace a function to a functional aten graph,
compile it, run it and compare.

Code generators (kiln-cpp, kiln-triton) run the same checks with their own ``codegen``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from kiln_loopir.compile import CompiledGraph, compile_fx

__all__ = ["trace_aten", "compile_fn", "check_against_eager", "tolerances"]


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


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    """Comparison tolerances for a result dtype (loose for low-precision floats)."""
    if dtype in (torch.float16, torch.bfloat16):
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
    actual = _flat(compiled(*run_inputs))
    assert len(actual) == len(expected), (len(actual), len(expected))
    for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if not isinstance(want, torch.Tensor):
            assert got == want, f"output {i}: {got!r} != {want!r}"
            continue
        assert got.dtype == want.dtype, f"output {i}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, (
            f"output {i}: size {tuple(got.shape)} != {tuple(want.shape)}"
        )
        torch.testing.assert_close(got, want, equal_nan=True, **tolerances(want.dtype))
        if (
            check_strides
            and want.is_contiguous()
            or want.is_contiguous(memory_format=torch.channels_last)
        ):
            for n, g, w in zip(got.shape, got.stride(), want.stride(), strict=True):
                assert n <= 1 or g == w, f"output {i}: stride {got.stride()} != {want.stride()}"
    return compiled
