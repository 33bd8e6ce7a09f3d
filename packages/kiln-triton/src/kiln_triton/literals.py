"""Values written into Triton source: a constant of a dtype, and the value masked lanes
contribute to a reduction or scan."""

from __future__ import annotations

import math

import torch


def literal(value: object, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)  # type: ignore[arg-type]
        if math.isnan(v) or math.isinf(v):
            return f'float("{v}")'
        return repr(v)
    return str(int(value))  # type: ignore[call-overload]


def identity(kind: str, dtype: torch.dtype) -> str:
    """The value masked lanes contribute to a reduction (in the compute type)."""
    if kind in ("sum", "welford"):
        return "0"
    if kind == "prod":
        return "1"
    big = kind in ("min", "argmin")
    if dtype.is_floating_point:
        return 'float("inf")' if big else 'float("-inf")'
    if dtype == torch.bool:
        return "1" if big else "0"
    info = torch.iinfo(dtype)
    return str(info.max if big else info.min)
