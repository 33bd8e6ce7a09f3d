"""The op-coverage corpus's frame record and its one check (the test_op_coverage*.py files).

A frame puts pointwise ops around the op it is built for. :func:`check_frame` compiles it on
the CPU with no eager fallback warning (every RuntimeWarning is an error here), checks that it
is one graph with generated C++ kernels, and that it agrees with eager forward and, where the
op is differentiable, backward. A ``fused`` frame's op has a lowering or a decomposition: it
must not run as an extern ATen call (no fallback is logged, and the loop IR of every graph
holds no extern call but those the frame names in ``externs``).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable

import torch

import kiln


@dataclasses.dataclass(frozen=True)
class Frame:
    fn: Callable
    shapes: tuple[tuple[int, ...], ...]
    differentiable: bool = True
    fused: bool = False  # runs in generated kernels, no extern ATen call
    dtype: torch.dtype = torch.float32
    externs: tuple[str, ...] = ()  # extern calls a fused frame may hold (of other ops)
    rtol: float | None = None  # None: assert_close's default for the dtype
    atol: float | None = None
    # the op's output shape depends on the data: the graph breaks around it (the op runs
    # between compiled graphs), so there may be more than one graph
    graph_breaks: bool = False
    # what eager runs for the comparison, where it cannot run fn itself (default: fn)
    eager: Callable | None = None


# tolerances for ops whose result rounds differently between equally good orders
# (factorizations, long products, sums of many terms in another order)
LOOSE = {"rtol": 1e-4, "atol": 1e-5}


def well_conditioned(x: torch.Tensor) -> torch.Tensor:
    """A square matrix (or a batch) far from singular, made from ``x``'s first columns."""
    n = x.shape[-2]
    return x[..., :n].sin() + n * torch.eye(n, dtype=x.dtype)


def symmetric_positive_definite(x: torch.Tensor) -> torch.Tensor:
    """``a aᵀ + n·I`` of ``x``'s first columns: symmetric, eigenvalues at least n."""
    n = x.shape[-2]
    a = x[..., :n]
    return a @ a.mT + n * torch.eye(n, dtype=x.dtype)


def outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def check_frame(name: str, frame: Frame, tmp_path, caplog) -> None:
    """Compile ``frame`` for inference and, if differentiable, for training; compare with
    eager and check the graphs and kernels (see the module docstring)."""
    torch.manual_seed(sum(map(ord, name)))
    inputs = [torch.randn(shape, dtype=frame.dtype) for shape in frame.shapes]
    tolerances = _tolerances(frame)
    caplog.set_level(logging.INFO, logger="kiln.fallbacks")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an eager fallback fails the test
        if frame.differentiable:
            # the training graphs: forward and backward, each compared with eager
            _check_training(frame, _compiled(frame, tmp_path / "training"), inputs, tolerances)
            _assert_kernels(frame, tmp_path / "training", ("forward", "backward"))
        else:
            out = outputs(_compiled(frame, tmp_path / "inference")(*inputs))
            expected = outputs((frame.eager or frame.fn)(*inputs))
            for got, want in zip(out, expected, strict=True):
                torch.testing.assert_close(got, want, **tolerances)
            _assert_kernels(frame, tmp_path / "inference", ("forward",))
    if frame.fused:
        _assert_no_extern_call(frame, tmp_path, caplog)


def _tolerances(frame: Frame) -> dict:
    if frame.rtol is None and frame.atol is None:
        return {}
    return {"rtol": frame.rtol or 0.0, "atol": frame.atol or 0.0}


def _compiled(frame: Frame, debug_dir) -> Callable:
    return kiln.compile(frame.fn, options={"debug_dir": str(debug_dir), "cache": False})


def _assert_kernels(frame: Frame, debug_dir, kinds: tuple[str, ...]) -> None:
    frames = sorted(p.name for p in debug_dir.iterdir())
    if frame.graph_breaks:
        # the graphs around the op: some have kernels (one before it may be empty)
        kernels = list(debug_dir.rglob("forward_kernels.cpp"))
        assert kernels, frames
        assert all('extern "C"' in p.read_text() for p in kernels), frames
        return
    assert frames == ["frame000"], frames  # one graph: no graph break around the op
    for kind in kinds:
        kernels = (debug_dir / "frame000" / f"{kind}_kernels.cpp").read_text()
        assert 'extern "C"' in kernels, kind


def _assert_no_extern_call(frame: Frame, tmp_path, caplog) -> None:
    fallbacks = [
        r.getMessage()
        for r in caplog.records
        if r.name == "kiln.fallbacks" and not any(e + "." in r.getMessage() for e in frame.externs)
    ]
    assert not fallbacks, fallbacks
    for loop_ir in sorted(tmp_path.glob("*/frame*/*_loopir.txt")):
        externs = [
            line.strip()
            for line in loop_ir.read_text().splitlines()
            if " = extern aten." in line and not any(e + "." in line for e in frame.externs)
        ]
        assert not externs, (loop_ir.name, externs)


def _check_training(frame: Frame, compiled: Callable, inputs, tolerances: dict) -> None:
    leaves = [x.clone().requires_grad_() for x in inputs]
    reference = [x.clone().requires_grad_() for x in inputs]
    out = outputs(compiled(*leaves))
    expected = outputs((frame.eager or frame.fn)(*reference))
    for got, want in zip(out, expected, strict=True):
        torch.testing.assert_close(got, want, **tolerances)
    differentiable = [(o, e) for o, e in zip(out, expected, strict=True) if e.requires_grad]
    assert differentiable, "a differentiable frame returns no tensor that needs a gradient"
    grads = [torch.randn_like(e) for _, e in differentiable]
    torch.autograd.backward([o for o, _ in differentiable], grads)
    torch.autograd.backward([e for _, e in differentiable], grads)
    for got, want in zip(leaves, reference, strict=True):
        if want.grad is None:
            assert got.grad is None
        else:
            torch.testing.assert_close(got.grad, want.grad, **tolerances)
