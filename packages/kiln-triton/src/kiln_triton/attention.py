"""Fused attention as a Triton kernel of Kiln's own, launched by the native host program in
place of ATen's attention ops (cuDNN, flash or memory-efficient attention, forward only).

``attention_fwd`` is one program per block of ``BLOCK_M`` queries of one (batch, head):
it walks the keys in blocks of ``BLOCK_N`` with an online softmax (running maximum and
sum, in float32, base-2 exponentials), adding an optional bias (an additive mask read
with its own strides, broadcast where a stride is 0) and the causal mask (a query sees
the keys at or before its position, as ``is_causal`` aligns them). A row whose keys are
all masked gives 0 (as ATen's safe softmax does). Products run in the inputs' dtype with
float32 accumulation; float32 inputs multiply in full float32 (``PRECISION="ieee"``, not
TF32, as ATen's float32 attention does). Query head ``h`` reads key and value head
``h // GROUP``: 1 for ATen's ops, more for grouped-query attention
(``kiln_loopir::grouped_attention``), whose shared heads are read where they are, with no
repeated copy.

:func:`attention_call` decides whether an extern node is such a call this covers (no
dropout, no log-sum-exp or other result read, head size a power of two from 16 to 256,
static sizes) and compiles the kernel for its layouts; the native host program launches
it like any other kernel. The Python host program keeps calling ATen.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import triton
import triton.language as tl

from kiln_loopir.grouped_attention import GROUPED_ATTENTION
from kiln_loopir.ir import ExternNode, TensorRef

aten = torch.ops.aten


@triton.jit
def attention_fwd(
    Q, K, V, Bias, Out, sm_scale,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    sbb, sbh, sbm, sbn, sob, soh, som, sod,
    H, M, N,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < M
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=rows[:, None],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    end = N
    if IS_CAUSAL:
        end = tl.minimum(N, (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        cols = offs_n < N
        k = tl.load(
            K + b * skb + kv * skh + offs_n[None, :] * skn + offs_d[:, None] * skd,
            mask=cols[None, :],
            other=0.0,
        )
        qk = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        if HAS_BIAS:
            bias = tl.load(
                Bias + b * sbb + h * sbh + offs_m[:, None] * sbm + offs_n[None, :] * sbn,
                mask=rows[:, None] & cols[None, :],
                other=0.0,
            )
            qk += bias.to(tl.float32) * 1.4426950408889634
        keep = cols[None, :]
        if IS_CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + b * svb + kv * svh + offs_n[:, None] * svn + offs_d[None, :] * svd,
            mask=cols[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
    tl.store(
        Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
        out.to(Out.dtype.element_ty),
        mask=rows[:, None],
    )


# op -> (positions of q, k, v, bias (None: none), dropout_p (None: none), is_causal)
OPS = {
    aten._scaled_dot_product_cudnn_attention.default: (0, 1, 2, 3, 5, 6),
    aten._scaled_dot_product_efficient_attention.default: (0, 1, 2, 3, 5, 6),
    aten._scaled_dot_product_flash_attention.default: (0, 1, 2, None, 3, 4),
    GROUPED_ATTENTION: (0, 1, 2, 3, None, 4),
}
SCALE_POSITIONS = {GROUPED_ATTENTION: 5}  # the others take ``scale`` as a keyword
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ALIGNMENT = 16  # bytes: a view's offset into its buffer the kernel is compiled to assume


@dataclass
class AttentionCall:
    """One attention node as the kernel computes it: its operands, output and constants."""

    q: TensorRef
    k: TensorRef
    v: TensorRef
    bias: TensorRef | None
    out: str  # the output buffer
    out_stride: tuple[int, ...]
    scale: float
    causal: bool
    group: int = 1  # query heads per key and value head

    @property
    def operands(self) -> list[TensorRef]:
        return [self.q, self.k, self.v] + ([self.bias] if self.bias is not None else [])

    def compile_args(self, device: str) -> dict:
        """What :func:`compile_attention` takes for this call: plain data (a cache entry
        keeps it to compile the kernel again)."""
        args = self.arguments()
        pairs = zip(_ints(self.q.size), self.out_stride, strict=True)
        out_span = 1 + sum((n - 1) * s for n, s in pairs)
        return {
            "args": {k: v for k, v in args.items() if k != "grid"},
            "grid": list(args["grid"]),
            "dtypes": [str(r.dtype).removeprefix("torch.") for r in self.operands],
            "spans": [_span(r) for r in self.operands] + [out_span],
            "device": device,
        }

    def arguments(self) -> dict:
        """The kernel's non-pointer arguments (strides, sizes, constants)."""
        (batch, heads, m, d), n = _ints(self.q.size), int(self.k.size[-2])
        bias_strides = _ints(_broadcast4(self.bias)) if self.bias is not None else (0,) * 4
        block_m = 64 if m > 32 else max(16, triton.next_power_of_2(m))
        return {
            "sm_scale": self.scale,
            **dict(zip(("sqb", "sqh", "sqm", "sqd"), _ints(self.q.stride), strict=True)),
            **dict(zip(("skb", "skh", "skn", "skd"), _ints(self.k.stride), strict=True)),
            **dict(zip(("svb", "svh", "svn", "svd"), _ints(self.v.stride), strict=True)),
            **dict(zip(("sbb", "sbh", "sbm", "sbn"), bias_strides, strict=True)),
            **dict(zip(("sob", "soh", "som", "sod"), self.out_stride, strict=True)),
            "H": heads,
            "M": m,
            "N": n,
            "GROUP": self.group,
            "HEAD_DIM": d,
            "BLOCK_M": block_m,
            "BLOCK_N": 64 if n > 32 else max(16, triton.next_power_of_2(n)),
            "HAS_BIAS": self.bias is not None,
            "IS_CAUSAL": self.causal,
            "PRECISION": "ieee" if self.q.dtype == torch.float32 else "tf32",
            "grid": (triton.cdiv(m, block_m), batch * heads, 1),
        }


def attention_call(node: ExternNode, read: set[str]) -> AttentionCall | None:
    """``node`` as the kernel's call, or None where it is not one this covers (``read``:
    the buffers something reads; results other than the output must not be among them)."""
    positions = OPS.get(node.target)
    if positions is None or not node.outputs or node.outputs[0] is None:
        return None
    if any(b is not None and b.name in read for b in node.outputs[1:]):
        return None
    args = list(node.args)
    q, k, v = (args[i] for i in positions[:3])
    bias = args[positions[3]] if positions[3] is not None and len(args) > positions[3] else None
    dropout = args[positions[4]] if positions[4] is not None and len(args) > positions[4] else 0.0
    causal = bool(args[positions[5]]) if len(args) > positions[5] else False
    refs = [r for r in (q, k, v, bias) if r is not None]
    out = node.outputs[0]
    if dropout or not all(isinstance(r, TensorRef) for r in refs):
        return None
    if any(r.dtype != q.dtype for r in (k, v)) or q.dtype not in DTYPES or out.dtype != q.dtype:
        return None
    layouts = [*(x for r in refs for x in (*r.size, *r.stride, r.offset)), *out.size, *out.stride]
    if not all(sympy.sympify(x).is_Integer for x in layouts):
        return None
    if len(q.size) != 4 or len(k.size) != 4 or len(v.size) != 4 or len(out.size) != 4:
        return None
    (batch, heads, m, d), (kb, kh, n, kd) = _ints(q.size), _ints(k.size)
    if (kb, kd) != (batch, d) or kh == 0 or heads % kh or _ints(v.size) != (batch, kh, n, d):
        return None
    if d not in (16, 32, 64, 128, 256) or min(batch, heads, m, n) == 0:
        return None
    if _ints(out.size) != (batch, heads, m, d):
        return None
    if bias is not None and (bias.dtype not in DTYPES or _broadcast4(bias) is None):
        return None
    if bias is not None and tuple(_ints(bias.size))[-2:] not in ((m, n), (1, n), (m, 1), (1, 1)):
        return None
    if any(int(r.offset) * r.dtype.itemsize % ALIGNMENT for r in refs):
        return None  # a view past an aligned start: the kernel assumes aligned pointers
    where = SCALE_POSITIONS.get(node.target)
    scale = node.kwargs.get("scale") if where is None else args[where]
    scale = float(scale) if scale is not None else d**-0.5
    group = heads // kh
    return AttentionCall(q, k, v, bias, out.name, _ints(out.stride), scale, causal, group)


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _span(ref: TensorRef) -> int:
    """Elements from the start of ``ref``'s buffer to one past its last element."""
    pairs = zip(_ints(ref.size), _ints(ref.stride), strict=True)
    return int(ref.offset) + 1 + sum((n - 1) * s for n, s in pairs)


def _broadcast4(bias: TensorRef) -> tuple | None:
    """The bias's strides over (batch, head, query, key), 0 where it broadcasts."""
    size, stride = list(bias.size), list(bias.stride)
    if len(size) > 4:
        return None
    size, stride = [1] * (4 - len(size)) + size, [0] * (4 - len(stride)) + stride
    return tuple(0 if int(n) == 1 else s for n, s in zip(size, stride, strict=True))


def pipeline_stages(head_dim: int, dtype: torch.dtype) -> int:
    """The software pipeline's depth over the blocks of keys and values: 3 for 16-bit
    heads of at most 64 (timed on an H100 from CUDA-graph replays: ViT-B/16's attention at
    batch 32 29.9 → 27.0 µs, BERT's at 8 x 128 tokens 5.46 → 5.32 µs, none of six shapes
    slower by more than 1.3 %), else 2 (a wider or float32 head takes twice the shared
    memory a stage, and was not timed)."""
    return 3 if head_dim <= 64 and dtype in (torch.float16, torch.bfloat16) else 2


def compile_attention(args: dict, grid: list, dtypes: list[str], spans: list[int], device: str):
    """The kernel compiled for these arguments (:meth:`AttentionCall.arguments` less the
    grid), on zero-filled q, k, v (and bias) of these dtypes and element spans; the last
    span is the output's. Plain data, so a cache entry can compile it again."""
    tensors = [
        torch.zeros(span, dtype=getattr(torch, dtype), device=device)
        for dtype, span in zip(dtypes, spans, strict=False)
    ]
    q, k, v = tensors[:3]
    bias = tensors[3] if args["HAS_BIAS"] else q
    out = torch.empty(spans[-1], dtype=q.dtype, device=device)
    grid = tuple(grid)
    stages = pipeline_stages(args["HEAD_DIM"], q.dtype)
    kernel = attention_fwd.run(q, k, v, bias, out, grid=grid, warmup=True, num_warps=4,
                               num_stages=stages, **args)  # fmt: skip
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    kernel[grid]  # loads the module: its function handle exists from here on
    return kernel, grid
