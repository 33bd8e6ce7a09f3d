"""torch dtypes as C++ types: how a buffer is stored, and how its values are computed."""

from __future__ import annotations

import torch

# the element type of a buffer in memory
STORAGE = {
    torch.float64: "double",
    torch.float32: "float",
    torch.float16: "_Float16",
    torch.bfloat16: "uint16_t",  # raw bits, converted by kiln::bf16_to_float / float_to_bf16
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    # bytes of 0 and 1, as torch stores booleans: gcc vectorises no loop that reads or
    # writes C++ `bool` in memory (a ReLU's mask made every training kernel scalar)
    torch.bool: "uint8_t",
}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def storage_type(dtype: torch.dtype) -> str:
    try:
        return STORAGE[dtype]
    except KeyError:
        raise NotImplementedError(f"kiln-cpp has no C++ type for {dtype} yet") from None


def value_type(dtype: torch.dtype) -> str:
    """The C++ type a value of ``dtype`` is held in (half precision is held as float)."""
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype in LOW_PRECISION else storage_type(dtype)


def load_expr(dtype: torch.dtype, element: str) -> str:
    """An element read from memory as a value."""
    if dtype == torch.bfloat16:
        return f"kiln::bf16_to_float({element})"
    if dtype == torch.float16:
        return f"static_cast<float>({element})"
    if dtype == torch.bool:
        return f"({element} != 0)"
    return element


def store_expr(dtype: torch.dtype, value: str) -> str:
    """A value converted to the element type of memory."""
    if dtype == torch.bfloat16:
        return f"kiln::float_to_bf16({value})"
    return f"static_cast<{storage_type(dtype)}>({value})"


def convert_expr(value: str, from_dtype: torch.dtype, to_dtype: torch.dtype) -> str:
    """``value`` converted as torch's ``.to(to_dtype)`` would (rounded for half types)."""
    if to_dtype == torch.bfloat16:
        return f"kiln::round_bf16(static_cast<float>({value}))"
    if to_dtype == torch.float16:
        return f"static_cast<float>(static_cast<_Float16>({value}))"
    if to_dtype == torch.bool:
        return f"static_cast<bool>({value})"
    if from_dtype.is_floating_point and not to_dtype.is_floating_point:
        # float -> int truncates toward zero, as torch does (out of range is undefined there too)
        return f"static_cast<{value_type(to_dtype)}>(std::trunc({value}))"
    return f"static_cast<{value_type(to_dtype)}>({value})"
