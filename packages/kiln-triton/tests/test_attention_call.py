"""Which attention nodes Kiln's attention kernel takes, and the plain data it is compiled
from (no device needed: the kernel itself runs in the GPU tests)."""

import sympy
import torch

from kiln_loopir.ir import Buffer, ExternNode, TensorRef
from kiln_triton.attention import attention_call

FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
CUDA = torch.device("cuda")
QKV_STRIDE = (4 * 100 * 64 * 3, 64, 4 * 64 * 3, 1)  # heads of one [2, 100, 3 * 256] product


def _ints(*values):
    return tuple(sympy.Integer(v) for v in values)


def _head(offset: int) -> TensorRef:
    size = _ints(2, 4, 100, 64)
    return TensorRef("qkv", torch.bfloat16, CUDA, size, _ints(*QKV_STRIDE), sympy.Integer(offset))


def _node(v_offset: int = 512, read_lse: bool = False) -> tuple[ExternNode, set[str]]:
    out = Buffer("out", torch.bfloat16, CUDA, _ints(2, 4, 100, 64), _ints(25600, 64, 256, 1))
    lse = Buffer("lse", torch.float32, CUDA, _ints(2, 4, 100), _ints(400, 100, 1))
    args = (_head(0), _head(256), _head(v_offset), 0.0, True, False)
    return ExternNode(FLASH, args, {}, [out, lse]), {"lse"} if read_lse else set()


def test_a_causal_flash_attention_is_taken_with_its_layouts():
    call = attention_call(*_node())
    assert call is not None and call.causal and call.out == "out"
    data = call.compile_args("cuda")
    assert data["grid"] == [2, 8, 1]  # blocks of 64 queries, batch x heads
    span = 1 + 76800 + 3 * 64 + 99 * 768 + 63  # one head's elements past its view's start
    assert data["spans"] == [span, span + 256, span + 512, 51200]
    assert data["dtypes"] == ["bfloat16"] * 3
    assert data["args"]["HEAD_DIM"] == 64 and data["args"]["IS_CAUSAL"]


def test_misaligned_views_and_read_log_sum_exps_stay_aten_calls():
    assert attention_call(*_node(v_offset=513)) is None  # 1026 bytes past an aligned start
    assert attention_call(*_node(read_lse=True)) is None  # a training graph's saved result


GROUPED = torch.ops.kiln_loopir.grouped_attention.default


def test_grouped_attention_reads_each_key_head_for_its_group_of_query_heads():
    zero = sympy.Integer(0)
    q = TensorRef("q", torch.bfloat16, CUDA, _ints(2, 8, 100, 64), _ints(51200, 64, 512, 1), zero)
    kv_size, kv_stride = _ints(2, 2, 100, 64), _ints(12800, 64, 128, 1)  # [2, 100, 2, 64]
    k = TensorRef("k", torch.bfloat16, CUDA, kv_size, kv_stride, zero)
    v = TensorRef("v", torch.bfloat16, CUDA, kv_size, kv_stride, zero)
    out = Buffer("out", torch.bfloat16, CUDA, _ints(2, 8, 100, 64), _ints(51200, 64, 512, 1))
    node = ExternNode(GROUPED, (q, k, v, None, True, 0.2, [51200, 64, 512, 1]), {}, [out])
    call = attention_call(node, set())
    assert call is not None and call.group == 4 and call.causal and call.scale == 0.2
    args = call.compile_args("cuda")["args"]
    assert args["GROUP"] == 4 and (args["skh"], args["svh"]) == (64, 64)
    uneven = TensorRef("k", torch.bfloat16, CUDA, _ints(2, 3, 100, 64), kv_stride, zero)
    assert attention_call(ExternNode(GROUPED, (q, uneven, v, None, True, 0.2, []), {}, [out]),
                          set()) is None  # fmt: skip
