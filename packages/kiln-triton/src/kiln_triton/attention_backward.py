"""The backward of fused attention as one Triton kernel of Kiln's own, launched by the
native host program in place of ATen's backward ops (cuDNN's, flash's, memory-efficient's).

ATen's run several kernels for one backward (cuDNN's: a fill of its float32 query-gradient
accumulator, a pass for ``rowsum(dO * O)``, the backward, a conversion of the query
gradient), and each fill or copy in a CUDA graph holds back the kernel after it. Here
``attention_bwd`` is the whole backward, with no accumulator to clear: program ``j`` of a
(batch, head) computes

- the key and value gradients of key block ``j``, walking the query blocks: the
  probabilities ``P = exp(S - lse)`` from the scores ``S`` (scaled, plus the bias) and the
  forward's log-sum-exp, ``dV += Pᵀ dO``, ``dS = P (dO Vᵀ - rowsum(dO * O))``,
  ``dK += dSᵀ Q``;
- the query gradient of query block ``j``, walking the key blocks: ``dQ += dS K``.

Scores and ``rowsum(dO * O)`` are computed again where both parts need them, which costs
less than a second kernel at the sizes attention runs at in a training step. Products run
in the inputs' dtype with float32 accumulation (float32 inputs in full float32), in base-2
exponentials as the forward kernel. A row whose keys are all masked (log-sum-exp -inf) has
probabilities 0, so its gradients are 0, as its output is.

:func:`attention_backward_call` decides whether an extern node is a backward this covers:
no dropout, no gradient of the bias asked for, keys and values with as many heads as the
queries, head size a power of two from 16 to 128, static sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import triton

from kiln_loopir.ir import ExternNode, TensorRef
from kiln_triton.attention import (
    BACKWARD_HEAD_SIZES,
    bias_strides,
    block_size,
    heads_shape,
    is_log_sum_exp,
    plain_compile_args,
    precision,
    strides,
)

aten = torch.ops.aten


# op -> positions of (grad_out, q, k, v, out, lse, bias (None: none), dropout_p, is_causal)
BACKWARD_OPS = {
    aten._scaled_dot_product_cudnn_attention_backward.default: (0, 1, 2, 3, 4, 5, 8, 13, 14),
    aten._scaled_dot_product_flash_attention_backward.default: (0, 1, 2, 3, 4, 5, None, 10, 11),
    aten._scaled_dot_product_efficient_attention_backward.default: (0, 1, 2, 3, 5, 6, 4, 9, 11),
}
# where an op takes cumulative sequence lengths (nested tensors), which this does not cover
CUMULATIVE = {
    aten._scaled_dot_product_cudnn_attention_backward.default: (9, 10),
    aten._scaled_dot_product_flash_attention_backward.default: (6, 7),
}


@dataclass
class BackwardCall:
    """One attention backward node as the kernel computes it."""

    grad_out: TensorRef
    q: TensorRef
    k: TensorRef
    v: TensorRef
    out: TensorRef
    lse: TensorRef
    bias: TensorRef | None
    dq: TensorRef  # the three gradients' buffers
    dk: TensorRef
    dv: TensorRef
    scale: float
    causal: bool

    kernel = "attention_bwd"

    @property
    def operands(self) -> list[TensorRef]:
        """What the kernel reads."""
        read = [self.grad_out, self.q, self.k, self.v, self.out, self.lse]
        return read + ([self.bias] if self.bias is not None else [])

    def pointers(self) -> dict[str, TensorRef]:
        """The kernel's pointer parameters (no bias: it points at the queries)."""
        return {"Q": self.q, "K": self.k, "V": self.v, "Bias": self.bias or self.q,
                "Out": self.out, "DOut": self.grad_out, "LSE": self.lse,
                "DQ": self.dq, "DK": self.dk, "DV": self.dv}  # fmt: skip

    def compile_args(self, device: str) -> dict:
        return plain_compile_args(self, device)

    def arguments(self) -> dict:
        """The kernel's non-pointer arguments (strides, sizes, constants) and its grid."""
        batch, heads, m, d = (int(x) for x in self.q.size)
        n = int(self.k.size[-2])
        block_m, block_n = block_size(m), block_size(n)
        return {
            "sm_scale": self.scale,
            **strides("sq", "bhmd", self.q),
            **strides("sk", "bhnd", self.k),
            **strides("sv", "bhnd", self.v),
            **bias_strides(self.bias),
            **strides("so", "bhmd", self.out),
            **strides("sg", "bhmd", self.grad_out),
            **strides("sl", "bhm", self.lse, count=3),
            **strides("sdq", "bhmd", self.dq),
            **strides("sdk", "bhnd", self.dk),
            **strides("sdv", "bhnd", self.dv),
            "H": heads,
            "M": m,
            "N": n,
            "HEAD_DIM": d,
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "HAS_BIAS": self.bias is not None,
            "IS_CAUSAL": self.causal,
            "PRECISION": precision(self.q.dtype),
            "grid": (max(triton.cdiv(m, block_m), triton.cdiv(n, block_n)), batch * heads, 1),
        }


def attention_backward_call(node: ExternNode, read: set[str]) -> BackwardCall | None:
    """``node`` as the kernel's call, or None where it is not one this covers (``read``:
    the buffers something reads; a bias gradient must not be among them)."""
    positions = BACKWARD_OPS.get(node.target)
    if positions is None or len(node.outputs) < 3 or any(o is None for o in node.outputs[:3]):
        return None
    if any(o is not None and o.name in read for o in node.outputs[3:]):
        return None  # the bias's gradient
    args = list(node.args)
    if any(i < len(args) and args[i] is not None for i in CUMULATIVE.get(node.target, ())):
        return None
    grad_out, q, k, v, out, lse = (args[i] for i in positions[:6])
    bias = args[positions[6]] if positions[6] is not None else None
    dropout = args[positions[7]] if len(args) > positions[7] else 0.0
    causal = bool(args[positions[8]]) if len(args) > positions[8] else False
    if dropout or not isinstance(lse, TensorRef):
        return None
    dq, dk, dv = (o.ref() for o in node.outputs[:3])
    shape = heads_shape(q, k, v, [grad_out, out, dq], bias)
    if shape is None or not all(_like(g, k) for g in (dk, dv)):
        return None
    batch, heads, m, n, d = shape
    if int(k.size[1]) != heads or d not in BACKWARD_HEAD_SIZES:
        return None
    if not is_log_sum_exp(lse, batch, heads, m) or int(lse.offset) * 4 % 16:
        return None
    scale = node.kwargs.get("scale")
    scale = float(scale) if scale is not None else d**-0.5
    return BackwardCall(grad_out, q, k, v, out, lse, bias, dq, dk, dv, scale, causal)


def backward_launch(head_dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(warps, pipeline stages) of the backward kernel."""
    return (4, 2) if head_dim <= 64 else (8, 1)


def _like(grad: TensorRef, ref: TensorRef) -> bool:
    """Whether ``grad`` is a static gradient buffer of ``ref``'s shape and dtype."""
    static = all(sympy.sympify(x).is_Integer for x in (*grad.size, *grad.stride))
    return static and grad.dtype == ref.dtype and tuple(grad.size) == tuple(ref.size)
