"""Matrix products on CUDA without ATen: ``mm`` and ``addmm`` (a bias over the columns,
``beta = alpha = 1``) of float32, float16 or bfloat16 matrices whose layouts cuBLAS takes
(each operand stored by rows or by columns, the result by rows and dense) become one
cuBLASLt call of the runtime (``runtime.Gemm``, see ``cuda_gemm.h``), prepared when the
program loads. :func:`gemm_call` gives None for any other extern op, which the runtime
calls through ATen as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from kiln_loopir.host import HostNotRendered
from kiln_loopir.ir import ExternNode, TensorRef

DTYPES = ("float32", "float16", "bfloat16")
ALIGNMENT = 16  # bytes: a view's offset into its buffer that keeps cuBLAS's fast paths


@dataclass
class GemmCall:
    """``d[m, n] = a[m, k] @ b[k, n] (+ bias[n])``: what ``runtime.Gemm`` prepares."""

    op_name: str
    dtype: str
    m: int
    n: int
    k: int
    a_ld: int
    a_by_columns: bool
    b_ld: int
    b_by_columns: bool
    d_ld: int
    bias: bool
    device: int
    operands: tuple[TensorRef, ...] = ()  # a, b, bias (when there is one): not stored
    kind: str = "gemm"
    prepared: object = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("prepared", "operands")}

    def prepare(self, runtime) -> None:
        try:
            self.prepared = runtime.Gemm(
                getattr(torch, self.dtype),
                self.m,
                self.n,
                self.k,
                self.a_ld,
                self.a_by_columns,
                self.b_ld,
                self.b_by_columns,
                self.d_ld,
                self.bias,
                self.device,
                self.op_name,
            )
        except (TypeError, ValueError, RuntimeError) as exc:
            raise HostNotRendered(f"{self.op_name}: {exc}") from exc


def gemm_call(node: ExternNode) -> GemmCall | None:
    """The cuBLASLt call of ``node``, or None where it is not a product this covers."""
    op = node.target
    if op not in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return None
    out = node.outputs[0] if len(node.outputs) == 1 else None
    if out is None or torch.device(out.device).type != "cuda":
        return None
    if str(out.dtype).removeprefix("torch.") not in DTYPES:
        return None
    if op is torch.ops.aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, a, b = node.args[:3]
    else:
        (a, b), bias = node.args[:2], None
    refs = [r for r in (a, b, bias) if r is not None]
    if not all(isinstance(r, TensorRef) and r.dtype == out.dtype for r in refs):
        return None
    layouts = [_static(r.size) + _static(r.stride) for r in (*refs, out)]
    if any(None in layout for layout in layouts):
        return None
    offsets = _static([r.offset for r in refs])
    if None in offsets or any(
        o * r.dtype.itemsize % ALIGNMENT for o, r in zip(offsets, refs, strict=True)
    ):
        return None
    (m, k), (k2, n) = _static(a.size), _static(b.size)
    if k != k2 or min(m, n, k) == 0 or tuple(_static(out.size)) != (m, n):
        return None
    a_layout, b_layout = _matrix(a), _matrix(b)
    d_layout = _matrix(out.ref())
    if a_layout is None or b_layout is None or d_layout != (n, False):
        return None  # the result must be dense by rows (cuBLASLt's bias epilogue asks it)
    if bias is not None and not _bias_over_columns(bias, m, n):
        return None
    device = torch.device(out.device).index or 0
    return GemmCall(
        str(op),
        str(out.dtype).removeprefix("torch."),
        m,
        n,
        k,
        *a_layout,
        *b_layout,
        n,
        bias is not None,
        device,
        tuple(refs),
    )


def _static(values) -> list[int | None]:
    exprs = [sympy.sympify(v) for v in values]
    return [int(e) if e.is_Integer else None for e in exprs]


def _matrix(ref: TensorRef) -> tuple[int, bool] | None:
    """(leading dimension, stored by columns) of a 2-D operand, or None."""
    (rows, cols), (s0, s1) = _static(ref.size), _static(ref.stride)
    if s1 == 1 or cols == 1:
        ld = s0 if rows > 1 else cols
        if ld >= max(cols, 1):
            return ld, False
    if s0 == 1 or rows == 1:
        ld = s1 if cols > 1 else rows
        if ld >= max(rows, 1):
            return ld, True
    return None


def _bias_over_columns(bias: TensorRef, m: int, n: int) -> bool:
    """A bias of one value per column: ``[n]`` dense, or ``[m, n]`` broadcast over rows."""
    size, stride = _static(bias.size), _static(bias.stride)
    if size == [n]:
        return stride == [1] or n == 1
    return size == [m, n] and (stride[0] == 0 or m == 1) and (stride[1] == 1 or n == 1)


def rebuild(data: dict) -> GemmCall:
    """A :class:`GemmCall` from :meth:`GemmCall.to_dict` (not yet prepared)."""
    if data.get("kind") != "gemm":
        raise HostNotRendered("not a stored matrix product")
    return GemmCall(**data)
