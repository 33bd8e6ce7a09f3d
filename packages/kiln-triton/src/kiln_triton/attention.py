"""Fused attention as a Triton kernel of Kiln's own, launched by the native host program in
place of ATen's attention ops (cuDNN, flash or memory-efficient attention; their backward
ops are :mod:`kiln_triton.attention_backward`'s).

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
repeated copy. Where a training graph saves the op's log-sum-exp for the backward, the
kernel writes it as ATen's ops define it: per query row, in float32, the natural
logarithm of the sum of ``exp`` of the scaled scores plus the bias (-inf for a row whose
keys are all masked), so ATen's backward and Kiln's read it alike.

:func:`attention_call` decides whether an extern node is such a call this covers (no
dropout, no result read but the output and the log-sum-exp, head size a power of two from
16 to 256, at most 256 keys, static sizes) and compiles the kernel for its layouts; the
native host program launches it like any other kernel. The Python host program keeps
calling ATen.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import triton

from kiln_loopir.grouped_attention import GROUPED_ATTENTION
from kiln_loopir.ir import ExternNode, TensorRef

aten = torch.ops.aten


# op -> (positions of q, k, v, bias (None: none), dropout_p (None: none), is_causal)
OPS = {
    aten._scaled_dot_product_cudnn_attention.default: (0, 1, 2, 3, 5, 6),
    aten._scaled_dot_product_efficient_attention.default: (0, 1, 2, 3, 5, 6),
    aten._scaled_dot_product_flash_attention.default: (0, 1, 2, None, 3, 4),
    GROUPED_ATTENTION: (0, 1, 2, 3, None, 4),
}
SCALE_POSITIONS = {GROUPED_ATTENTION: 5}  # the others take ``scale`` as a keyword
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_SIZES = (16, 32, 64, 128, 256)
BACKWARD_HEAD_SIZES = (16, 32, 64, 128)  # kiln_triton.attention_backward's
ALIGNMENT = 16  # bytes: a view's offset into its buffer the kernel is compiled to assume
# Longer rows of keys stay ATen's: on the H100 (bf16, 32 x 12 heads x 512 x 64, a key mask)
# the forward took 172 µs against cuDNN's 107, the backward 431 against 340; at 197 keys
# and below both were faster than cuDNN's (or within 8 %, with three kernels fewer).
MAX_KEYS = 256


@dataclass
class AttentionCall:
    """One attention node as the kernel computes it: its operands, results and constants."""

    q: TensorRef
    k: TensorRef
    v: TensorRef
    bias: TensorRef | None
    out: TensorRef  # the output buffer
    lse: TensorRef | None  # the log-sum-exp buffer, where something reads it
    scale: float
    causal: bool
    group: int = 1  # query heads per key and value head

    kernel = "attention_fwd"

    @property
    def operands(self) -> list[TensorRef]:
        """What the kernel reads."""
        return [self.q, self.k, self.v] + ([self.bias] if self.bias is not None else [])

    def pointers(self) -> dict[str, TensorRef]:
        """The kernel's pointer parameters (an unused one points at the queries or output)."""
        return {"Q": self.q, "K": self.k, "V": self.v, "Bias": self.bias or self.q,
                "Out": self.out, "LSE": self.lse or self.out}  # fmt: skip

    def compile_args(self, device: str) -> dict:
        """What ``kiln_triton.attention_kernels.compile_attention`` takes for this call:
        plain data (a cache entry keeps it to compile the kernel again)."""
        return plain_compile_args(self, device)

    def arguments(self) -> dict:
        """The kernel's non-pointer arguments (strides, sizes, constants) and its grid."""
        (batch, heads, m, d), n = _ints(self.q.size), int(self.k.size[-2])
        block_m = block_size(m)
        return {
            "sm_scale": self.scale,
            **strides("sq", "bhmd", self.q),
            **strides("sk", "bhnd", self.k),
            **strides("sv", "bhnd", self.v),
            **bias_strides(self.bias),
            **strides("so", "bhmd", self.out),
            **strides("sl", "bhm", self.lse, count=3),
            "H": heads,
            "M": m,
            "N": n,
            "GROUP": self.group,
            "HEAD_DIM": d,
            "BLOCK_M": block_m,
            "BLOCK_N": block_size(n),
            "HAS_BIAS": self.bias is not None,
            "IS_CAUSAL": self.causal,
            "HAS_LSE": self.lse is not None,
            "PRECISION": precision(self.q.dtype),
            "grid": (triton.cdiv(m, block_m), batch * heads, 1),
        }


def attention_call(node: ExternNode, read: set[str]) -> AttentionCall | None:
    """``node`` as the kernel's call, or None where it is not one this covers (``read``:
    the buffers something reads: of its other results only the log-sum-exp and the
    random generator's seed and offset may be, which no dropout uses)."""
    positions = OPS.get(node.target)
    if positions is None or not node.outputs or node.outputs[0] is None:
        return None
    args = list(node.args)
    q, k, v = (args[i] for i in positions[:3])
    bias = args[positions[3]] if positions[3] is not None and len(args) > positions[3] else None
    dropout = args[positions[4]] if positions[4] is not None and len(args) > positions[4] else 0.0
    causal = bool(args[positions[5]]) if len(args) > positions[5] else False
    if dropout or not all(isinstance(r, TensorRef) for r in (q, k, v)):
        return None
    out = node.outputs[0].ref()
    shape = heads_shape(q, k, v, [out], bias)
    if shape is None:
        return None
    batch, heads, m, _, _ = shape
    lse = None
    for i, result in enumerate(node.outputs[1:], start=1):
        if result is None or result.name not in read or result.dtype in (torch.int64, torch.uint64):
            continue
        if i != 1 or not is_log_sum_exp(result.ref(), batch, heads, m):
            return None
        if int(q.size[-1]) not in BACKWARD_HEAD_SIZES:
            return None  # its backward stays ATen's: so does the forward that saves for it
        lse = result.ref()
    where = SCALE_POSITIONS.get(node.target)
    scale = node.kwargs.get("scale") if where is None else args[where]
    scale = float(scale) if scale is not None else int(q.size[-1]) ** -0.5
    group = heads // int(k.size[1])
    return AttentionCall(q, k, v, bias, out, lse, scale, causal, group)


def heads_shape(q, k, v, same_as_q: list, bias) -> tuple[int, int, int, int, int] | None:
    """(batch, heads, queries, keys, head size) where the kernels take these operands:
    static 4-d layouts, at most ``MAX_KEYS`` keys, key and value heads dividing the query
    heads, ``same_as_q`` shaped and typed as the queries, a bias the kernels read (None:
    none), views at aligned offsets. None where they do not."""
    refs = [q, k, v, *same_as_q] + ([bias] if bias is not None else [])
    if not all(isinstance(r, TensorRef) for r in refs):
        return None
    layouts = [x for r in refs for x in (*r.size, *r.stride, r.offset)]
    if not all(sympy.sympify(x).is_Integer for x in layouts):
        return None
    if any(len(r.size) != 4 for r in (q, k, v, *same_as_q)) or q.dtype not in DTYPES:
        return None
    if any(r.dtype != q.dtype for r in (k, v, *same_as_q)):
        return None
    (batch, heads, m, d), (kb, kh, n, kd) = _ints(q.size), _ints(k.size)
    if (kb, kd) != (batch, d) or kh == 0 or heads % kh or _ints(v.size) != (batch, kh, n, d):
        return None
    if d not in HEAD_SIZES or min(batch, heads, m, n) == 0 or n > MAX_KEYS:
        return None
    if any(_ints(r.size) != (batch, heads, m, d) for r in same_as_q):
        return None
    if bias is not None and (bias.dtype not in DTYPES or _broadcast4(bias) is None):
        return None
    if bias is not None and tuple(_ints(bias.size))[-2:] not in ((m, n), (1, n), (m, 1), (1, 1)):
        return None
    if any(int(r.offset) * r.dtype.itemsize % ALIGNMENT for r in refs):
        return None  # a view past an aligned start: the kernel assumes aligned pointers
    return batch, heads, m, n, d


def is_log_sum_exp(ref: TensorRef, batch: int, heads: int, m: int) -> bool:
    """Whether ``ref`` is laid out as an attention op's log-sum-exp: float32 over (batch,
    head, query), the query dimension padded or followed by a dimension of 1."""
    size = _ints(ref.size) if all(sympy.sympify(x).is_Integer for x in ref.size) else None
    if ref.dtype != torch.float32 or size is None or len(size) not in (3, 4):
        return False
    return size[:2] == (batch, heads) and size[2] >= m and size[3:] in ((), (1,))


def strides(prefix: str, dims: str, ref: TensorRef | None, count: int = 4) -> dict[str, int]:
    """``ref``'s first ``count`` strides as the kernels name them (0s for no tensor)."""
    values = _ints(ref.stride)[:count] if ref is not None else (0,) * count
    return {f"{prefix}{dim}": value for dim, value in zip(dims, values, strict=True)}


def bias_strides(bias: TensorRef | None) -> dict[str, int]:
    values = _ints(_broadcast4(bias)) if bias is not None else (0,) * 4
    return dict(zip(("sbb", "sbh", "sbm", "sbn"), values, strict=True))


def precision(dtype: torch.dtype) -> str:
    """float32 multiplies in full float32, as ATen's float32 attention does."""
    return "ieee" if dtype == torch.float32 else "tf32"


def plain_compile_args(call, device: str) -> dict:
    """A call's kernel, arguments, grid and pointer buffers (dtype and element span each)."""
    args = call.arguments()
    return {
        "kernel": call.kernel,
        "args": {k: v for k, v in args.items() if k != "grid"},
        "grid": list(args["grid"]),
        "buffers": {
            name: [str(ref.dtype).removeprefix("torch."), _span(ref)]
            for name, ref in call.pointers().items()
        },
        "device": device,
    }


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


def forward_launch(head_dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(warps, pipeline stages) of the forward kernel."""
    return 4, pipeline_stages(head_dim, dtype)


def block_size(length: int) -> int:
    """Queries or keys a kernel's program takes at a time: 64, fewer for a short row."""
    return 64 if length > 32 else max(16, triton.next_power_of_2(length))
