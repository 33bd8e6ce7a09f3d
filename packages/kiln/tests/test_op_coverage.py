"""Frames built around ops outside the usual fused set compile whole, and match eager.

Each frame puts pointwise ops around one op: reductions to a scalar, variance, norms,
sorting-based ops, cumulative ops (scans in kiln-cpp), bucketing, embedding bags, linalg.
Each compiles on the CPU with no eager fallback warning (every RuntimeWarning is an error
here), generates C++ kernels, and agrees with eager forward and, where the op is
differentiable, backward. The ops marked ``fused`` have a lowering or a decomposition: they
must not run as an extern ATen call (no fallback is logged, and the loop IR of every graph
holds no extern call but those the frame names in ``externs``).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import kiln


@dataclasses.dataclass(frozen=True)
class Frame:
    fn: Callable
    shapes: tuple[tuple[int, ...], ...]
    differentiable: bool = True
    fused: bool = False  # runs in generated kernels, no extern ATen call
    dtype: torch.dtype = torch.float32
    externs: tuple[str, ...] = ()  # extern calls a fused frame may hold (of other ops)


# 13 indices in 4 bags, the second one empty (and the last offset the end, where it is given)
BAG_INDICES = torch.tensor([1, 3, 4, 3, 10, 0, 7, 7, 2, 9, 3, 5, 8])
BAG_OFFSETS = torch.tensor([0, 4, 4, 9, 13])


def _well_conditioned(x):
    return x[:, :4].sin() + 4 * torch.eye(4)


FRAMES = {
    "max": Frame(lambda x: (x.sin().max() * 2 + x).cos(), ((4, 6),), fused=True),
    "min": Frame(lambda x: (x.cos().min() - x).exp(), ((4, 6),), fused=True),
    "argmax": Frame(lambda x: (x * 3).argmax() + x.sum().long(), ((4, 6),), False, True),
    "var_mean": Frame(
        lambda x: [t * 2 for t in torch.var_mean(x.sin() + 1, dim=1, correction=0)],
        ((4, 6),),
        fused=True,
    ),
    "var_mean_unbiased": Frame(
        lambda x: torch.var_mean(x.tanh(), dim=0, keepdim=True)[0] + x, ((5, 3),), fused=True
    ),
    "norm": Frame(lambda x: x / (x.relu().norm() + 1), ((4, 6),), fused=True),
    "vector_norm_3": Frame(
        lambda x: torch.linalg.vector_norm(x.sin(), 3) * x.cos(), ((4, 6),), fused=True
    ),
    "erfinv": Frame(lambda x: torch.erfinv(x.sin() * 0.9) * x, ((4, 6),), fused=True),
    "median": Frame(lambda x: torch.median(x.sin()) + x * 2, ((4, 6),)),
    "kthvalue": Frame(lambda x: torch.kthvalue(x.exp(), 2, dim=1).values.sigmoid(), ((4, 6),)),
    "cumsum": Frame(lambda x: torch.cumsum(x.sin(), 0) * x, ((4, 7),), fused=True),
    "cumsum_3d_middle_dim": Frame(
        lambda x: torch.cumsum(x * 2, 1).exp() / 4, ((3, 4, 6),), fused=True
    ),
    "cumsum_float64": Frame(
        lambda x: torch.cumsum(x.cos(), -1) + x, ((9, 4),), fused=True, dtype=torch.float64
    ),
    "cumsum_bfloat16": Frame(
        lambda x: torch.cumsum(x, 1) * 2, ((10, 3),), False, True, dtype=torch.bfloat16
    ),
    "cumsum_long": Frame(lambda x: torch.cumsum(x.sin(), 1) * x, ((3, 40),), fused=True),
    "cummax_long": Frame(lambda x: torch.cummax(x * 2, 0).values.exp(), ((19, 2),), fused=True),
    "cumsum_int64": Frame(lambda x: torch.cumsum((x * 4).long(), 0) + 1, ((9, 3),), False, True),
    "cumprod": Frame(lambda x: torch.cumprod(x.sin() + 1.5, 1) * x, ((6, 4),), fused=True),
    "logcumsumexp": Frame(lambda x: torch.logcumsumexp(x * 2, 1).tanh(), ((6, 4),), fused=True),
    "logcumsumexp_dim0": Frame(lambda x: torch.logcumsumexp(x, 0) - x, ((3, 11),), fused=True),
    "cummax": Frame(
        lambda x: torch.cummax(x.sin(), 0).values * x + torch.cummax(x, 1).indices,
        ((4, 3),),
        fused=True,
    ),
    "cummin_3d": Frame(
        lambda x: torch.cummin(x.exp(), -1).values - torch.cummin(x, 1).indices,
        ((2, 3, 4),),
        fused=True,
    ),
    "searchsorted": Frame(
        lambda x, y: torch.searchsorted(torch.sort(x.flatten()).values, y.cos()) * 2 + 1,
        ((4, 6), (3, 5)),
        differentiable=False,
        fused=True,
        externs=("aten.sort",),
    ),
    "searchsorted_rows_right": Frame(
        lambda x, y: torch.searchsorted(torch.sort(x, 1).values, y, right=True, out_int32=True),
        ((3, 13), (3, 5)),
        differentiable=False,
        fused=True,
        externs=("aten.sort",),
    ),
    "bucketize": Frame(
        lambda x: torch.bucketize(x.sin(), torch.tensor([-0.5, 0.0, 0.5])) + x.abs(),
        ((4, 6),),
        fused=True,
    ),
    "histc": Frame(
        lambda x: torch.histc(x.sin(), bins=5, min=-1, max=1) / x.numel() + 1,
        ((4, 6),),
        differentiable=False,
        fused=True,
    ),
    "histc_float64_bins_7": Frame(
        lambda x: torch.histc(x, bins=7, min=-2, max=1.5) * 2,
        ((5, 31),),
        differentiable=False,
        fused=True,
        dtype=torch.float64,
    ),
    "embedding_bag_sum": Frame(
        lambda w: F.embedding_bag(BAG_INDICES, w.sin(), BAG_OFFSETS, mode="sum") * 2,
        ((11, 5),),
        fused=True,
    ),
    "embedding_bag_mean_padding": Frame(
        lambda w: F.embedding_bag(
            BAG_INDICES, w, BAG_OFFSETS, mode="mean", padding_idx=3, include_last_offset=True
        ).cos(),
        ((11, 6),),
        fused=True,
    ),
    "embedding_bag_per_sample_weights": Frame(
        lambda w, p: F.embedding_bag(
            BAG_INDICES, w, BAG_OFFSETS, mode="sum", per_sample_weights=p.exp()
        ),
        ((11, 3), (13,)),
        fused=True,
    ),
    "embedding_bag_2d_input": Frame(
        lambda w: F.embedding_bag(BAG_INDICES[:12].view(4, 3), w * 3, mode="mean"),
        ((11, 4),),
        fused=True,
    ),
    "solve": Frame(
        lambda x: torch.linalg.solve(_well_conditioned(x), x[:, 4:].cos()) * 2, ((4, 6),)
    ),
    "qr": Frame(lambda x: [t.abs() * 2 for t in torch.linalg.qr(x.sin() + 1)], ((6, 4),)),
}


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _tolerances(name: str) -> dict:
    # linalg and long products round differently between calls of the same kernel order
    return {"rtol": 1e-4, "atol": 1e-5} if name in ("solve", "qr", "cumprod") else {}


def _compiled(frame: Frame, debug_dir) -> Callable:
    return kiln.compile(frame.fn, options={"debug_dir": str(debug_dir), "cache": False})


def _assert_one_graph_with_kernels(debug_dir, kinds: tuple[str, ...]) -> None:
    frames = sorted(p.name for p in debug_dir.iterdir())
    assert frames == ["frame000"], frames  # one graph: no graph break around the op
    for kind in kinds:
        kernels = (debug_dir / "frame000" / f"{kind}_kernels.cpp").read_text()
        assert 'extern "C"' in kernels, kind


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_compiles_and_matches_eager(name, tmp_path, caplog):
    frame = FRAMES[name]
    torch.manual_seed(sum(map(ord, name)))
    inputs = [torch.randn(shape, dtype=frame.dtype) for shape in frame.shapes]
    caplog.set_level(logging.INFO, logger="kiln.fallbacks")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an eager fallback fails the test
        out = _outputs(_compiled(frame, tmp_path / "inference")(*inputs))
        expected = _outputs(frame.fn(*inputs))
        for got, want in zip(out, expected, strict=True):
            torch.testing.assert_close(got, want, **_tolerances(name))
        _assert_one_graph_with_kernels(tmp_path / "inference", ("forward",))
        if frame.differentiable:
            _check_training(name, frame, _compiled(frame, tmp_path / "training"), inputs)
            _assert_one_graph_with_kernels(tmp_path / "training", ("forward", "backward"))
    if frame.fused:
        fallbacks = [
            r.getMessage()
            for r in caplog.records
            if r.name == "kiln.fallbacks"
            and not any(e + "." in r.getMessage() for e in frame.externs)
        ]
        assert not fallbacks, fallbacks
        for loop_ir in sorted(tmp_path.glob("*/frame000/*_loopir.txt")):
            externs = [
                line.strip()
                for line in loop_ir.read_text().splitlines()
                if " = extern aten." in line and not any(e + "." in line for e in frame.externs)
            ]
            assert not externs, (loop_ir.name, externs)


def _check_training(name, frame, compiled, inputs):
    leaves = [x.clone().requires_grad_() for x in inputs]
    reference = [x.clone().requires_grad_() for x in inputs]
    out = _outputs(compiled(*leaves))
    expected = _outputs(frame.fn(*reference))
    for got, want in zip(out, expected, strict=True):
        torch.testing.assert_close(got, want, **_tolerances(name))
    grads = [torch.randn_like(t) for t in expected]
    torch.autograd.backward(out, grads)
    torch.autograd.backward(expected, grads)
    for got, want in zip(leaves, reference, strict=True):
        torch.testing.assert_close(got.grad, want.grad, **_tolerances(name))


@pytest.mark.parametrize("host_program", ["auto", "python"])
def test_a_linalg_error_check_survives_compilation(host_program):
    def f(a, b):
        return torch.linalg.solve(a.cos(), b) * 2

    compiled = kiln.compile(f, options={"cache": False, "host_program": host_program})
    a, b = torch.randn(3, 3), torch.randn(3, 2)
    torch.testing.assert_close(compiled(a, b), f(a, b), rtol=1e-4, atol=1e-5)
    singular = torch.randn(3, 3)
    singular[:, 2] = singular[:, 1]  # two equal columns, after cos() too
    # the Python host program raises eager's torch.linalg.LinAlgError itself; the native
    # one, a RuntimeError (LinAlgError's base) with its message: the check is a Python
    # custom op, whose exception reaches C++ as a plain error
    expected = torch.linalg.LinAlgError if host_program == "python" else RuntimeError
    with pytest.raises(expected, match="torch.linalg.solve: The solver failed"):
        compiled(singular, b)
