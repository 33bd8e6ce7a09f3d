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
import triton.language as tl

from kiln_loopir.ir import ExternNode, TensorRef
from kiln_triton.attention import (
    BACKWARD_HEAD_SIZES,
    bias_strides,
    block_size,
    heads_shape,
    is_log_sum_exp,
    plain_compile_args,
    precision,
    scores,
    strides,
    transposed,
)

aten = torch.ops.aten


@triton.jit
def _query_block(
    Q, DOut, Out, LSE, b, h, offs_m, offs_d, rows,
    sqb, sqh, sqm, sqd, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
):  # fmt: skip
    """A block of queries: their values, their outputs' gradients, their log-sum-exps in
    base 2 (+inf for a row whose keys are all masked, so that its probabilities are 0) and
    ``rowsum(dO * O)``."""
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=rows[:, None],
        other=0.0,
    )
    do = tl.load(
        DOut + b * sgb + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
        mask=rows[:, None],
        other=0.0,
    )
    o = tl.load(
        Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
        mask=rows[:, None],
        other=0.0,
    )
    lse = tl.load(LSE + b * slb + h * slh + offs_m * slm, mask=rows, other=0.0)
    lse = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    return q, do, lse, delta


@triton.jit
def _score_gradients(q, kt, vt, do, lse, delta, Bias, b, h, offs_m, offs_n, rows, cols,
                     qk_scale, sbb, sbh, sbm, sbn,
                     HAS_BIAS: tl.constexpr, IS_CAUSAL: tl.constexpr,
                     PRECISION: tl.constexpr):  # fmt: skip
    """The probabilities ``P`` of a block of queries by a block of keys and the gradient of
    their scores, ``dS = P (dO Vᵀ - rowsum(dO * O))``."""
    qk = scores(q, kt, Bias, b, h, offs_m, offs_n, rows, cols, qk_scale,
                sbb, sbh, sbm, sbn, HAS_BIAS, IS_CAUSAL, PRECISION)  # fmt: skip
    p = tl.math.exp2(qk - lse[:, None])
    dp = tl.dot(do, vt, input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def attention_bwd(
    Q, K, V, Bias, Out, DOut, LSE, DQ, DK, DV, sm_scale,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    sbb, sbh, sbm, sbn, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
    sdqb, sdqh, sdqm, sdqd, sdkb, sdkh, sdkn, sdkd, sdvb, sdvh, sdvn, sdvd,
    H, M, N,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = sm_scale * 1.4426950408889634

    # the key and value gradients of key block pid
    start_n = pid * BLOCK_N
    if start_n < N:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        cols = offs_n < N
        kt = transposed(K, b, h, offs_n, offs_d, cols, skb, skh, skn, skd)
        vt = transposed(V, b, h, offs_n, offs_d, cols, svb, svh, svn, svd)
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        first = 0
        if IS_CAUSAL:
            first = (start_n // BLOCK_M) * BLOCK_M  # earlier queries see none of these keys
        for start_m in range(first, M, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            rows = offs_m < M
            q, do, lse, delta = _query_block(
                Q, DOut, Out, LSE, b, h, offs_m, offs_d, rows,
                sqb, sqh, sqm, sqd, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
            )  # fmt: skip
            p, ds = _score_gradients(q, kt, vt, do, lse, delta, Bias, b, h, offs_m, offs_n,
                                     rows, cols, qk_scale, sbb, sbh, sbm, sbn,
                                     HAS_BIAS, IS_CAUSAL, PRECISION)  # fmt: skip
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        dk = dk * sm_scale
        tl.store(
            DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
            dk.to(DK.dtype.element_ty),
            mask=cols[:, None],
        )
        tl.store(
            DV + b * sdvb + h * sdvh + offs_n[:, None] * sdvn + offs_d[None, :] * sdvd,
            dv.to(DV.dtype.element_ty),
            mask=cols[:, None],
        )

    # the query gradient of query block pid
    start_m = pid * BLOCK_M
    if start_m < M:
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < M
        q, do, lse, delta = _query_block(
            Q, DOut, Out, LSE, b, h, offs_m, offs_d, rows,
            sqb, sqh, sqm, sqd, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
        )  # fmt: skip
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        end = N
        if IS_CAUSAL:
            end = tl.minimum(N, start_m + BLOCK_M)  # later keys are masked for all these rows
        for start_n in range(0, end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            cols = offs_n < N
            kt = transposed(K, b, h, offs_n, offs_d, cols, skb, skh, skn, skd)
            vt = transposed(V, b, h, offs_n, offs_d, cols, svb, svh, svn, svd)
            _, ds = _score_gradients(q, kt, vt, do, lse, delta, Bias, b, h, offs_m, offs_n,
                                     rows, cols, qk_scale, sbb, sbh, sbm, sbn,
                                     HAS_BIAS, IS_CAUSAL, PRECISION)  # fmt: skip
            dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)
        dq = dq * sm_scale
        tl.store(
            DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd,
            dq.to(DQ.dtype.element_ty),
            mask=rows[:, None],
        )


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
