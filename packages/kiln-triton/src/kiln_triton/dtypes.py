"""torch dtypes as Triton types: how values are held in registers and converted.

Half-precision floats (float16, bfloat16) are loaded and computed in float32; a value
converted to one of them is rounded (to it and back), and memory gets the narrow type on
store (Triton converts to the pointer's element type).
"""

from __future__ import annotations

import torch

from kiln_triton.errors import TritonCodegenError

TL = {
    torch.float64: "tl.float64",
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int16: "tl.int16",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def tl_type(dtype: torch.dtype) -> str:
    try:
        return TL[dtype]
    except KeyError:
        raise TritonCodegenError(f"kiln-triton has no Triton type for {dtype} yet") from None


def compute_type(dtype: torch.dtype) -> str:
    """The Triton type a value of ``dtype`` is held in (half precision as float32)."""
    return "tl.float32" if dtype in LOW_PRECISION else tl_type(dtype)


def convert(value: str, src: torch.dtype, dst: torch.dtype) -> str:
    """``value`` (held as ``compute_type(src)``) converted as torch's ``.to(dst)`` would."""
    if src == dst:
        return value
    if dst == torch.bool:
        return f"({value} != 0)"
    if dst in LOW_PRECISION:
        return f"{value}.to({tl_type(dst)}).to(tl.float32)"
    if src == torch.bool:
        return f"{value}.to(tl.int8).to({tl_type(dst)})"
    return f"{value}.to({tl_type(dst)})"
