"""The ops of the reference backend, on torch tensors over a whole index grid."""

from __future__ import annotations

import math

import torch

from kiln_loopir import size_math

_MASK32 = 0xFFFFFFFF


def index_var(grid: tuple, dim: int, device) -> torch.Tensor:
    """``arange(grid[dim])`` shaped to broadcast along ``dim`` of ``grid``."""
    shape = [1] * len(grid)
    shape[dim] = grid[dim]
    return torch.arange(grid[dim], dtype=torch.int64, device=device).view(shape)


def flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of the storage ``t`` spans, starting at ``t``'s first element."""
    span = (
        1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    )
    return torch.as_strided(t, (span,), (1,), t.storage_offset())


def _as_index(index, device) -> torch.Tensor:
    return torch.as_tensor(index, dtype=torch.int64, device=device)


def load(ptr: torch.Tensor, index, mask=None) -> torch.Tensor:
    idx = _as_index(index, ptr.device)
    if mask is not None:
        idx, mask = torch.broadcast_tensors(idx, mask)
        idx = torch.where(mask, idx, 0)
    if ptr.numel() == 0:
        return torch.zeros(idx.shape, dtype=ptr.dtype, device=ptr.device)
    return ptr[idx]


def store(ptr: torch.Tensor, index, value, accumulate: bool = False) -> None:
    idx = _as_index(index, ptr.device)
    value = torch.as_tensor(value, device=ptr.device).to(ptr.dtype)
    idx, value = torch.broadcast_tensors(idx, value)
    if accumulate:
        ptr.index_put_((idx.reshape(-1),), value.reshape(-1), accumulate=True)
    else:
        ptr[idx] = value


def store_add(ptr, index, value) -> None:
    store(ptr, index, value, accumulate=True)


def reduction(kind: str, value, src_dtype, grid: tuple, nred: int, device=None) -> torch.Tensor:
    """Reduce the trailing ``nred`` dims of ``value`` (broadcast to ``grid``), keeping them."""
    v = torch.as_tensor(value).to(device=device, dtype=src_dtype).expand(grid)
    outer = grid[: len(grid) - nred]
    kept = tuple(outer) + (1,) * nred
    flat_v = v.reshape(*outer, math.prod(grid[len(outer) :]))
    if flat_v.shape[-1] == 0 and kind in ("max", "min", "argmax", "argmin"):
        # nothing to reduce (only a zero-size result reads this): the identity of the op
        if kind.startswith("arg"):
            return torch.zeros(kept, dtype=torch.int64, device=v.device)
        info = torch.finfo(v.dtype) if v.dtype.is_floating_point else torch.iinfo(v.dtype)
        fill = (
            (-math.inf if kind == "max" else math.inf)
            if v.dtype.is_floating_point
            else (info.min if kind == "max" else info.max)
        )
        return torch.full(kept, fill, dtype=v.dtype, device=v.device)
    if v.dtype == torch.bool and kind in ("max", "min", "argmax", "argmin"):
        # torch's arg-reductions refuse bool: order False < True as 0 < 1
        out = reduction(kind, v.to(torch.uint8), torch.uint8, grid, nred, device)
        return out if kind.startswith("arg") else out.to(torch.bool)
    if kind in ("sum", "dot"):
        out = flat_v.sum(-1)
    elif kind == "prod":
        out = flat_v.prod(-1)
    elif kind == "max":
        out = flat_v.amax(-1)
    elif kind == "min":
        out = flat_v.amin(-1)
    elif kind == "argmax":
        out = flat_v.argmax(-1)
    elif kind == "argmin":
        out = flat_v.argmin(-1)
    elif kind == "any":
        out = flat_v.bool().any(-1)
    elif kind == "all":
        out = flat_v.bool().all(-1)
    elif kind == "welford.mean":
        out = flat_v.mean(-1)
    elif kind == "welford.m2":
        mean = flat_v.mean(-1, keepdim=True)
        out = ((flat_v - mean) ** 2).sum(-1)
    else:
        raise ValueError(f"unknown reduction {kind!r}")
    return out.reshape(kept)


def constant(value, dtype) -> torch.Tensor:
    return torch.tensor(value, dtype=dtype)


def index_expr(value, dtype) -> torch.Tensor:
    return torch.as_tensor(value).to(dtype)


def to_dtype(x, dtype) -> torch.Tensor:
    return torch.as_tensor(x).to(dtype)


def where(cond, a, b) -> torch.Tensor:
    return torch.where(cond, a, b)


def masked(mask, value, other) -> torch.Tensor:
    value = torch.as_tensor(value)
    return torch.where(mask, value, torch.tensor(other, dtype=value.dtype))


def indirect_indexing(x, size, mask=None) -> torch.Tensor:
    idx = torch.as_tensor(x).to(torch.int64)
    idx = torch.where(idx < 0, idx + size, idx)
    bad = (idx < 0) | (idx >= size)
    if mask is not None:
        bad = bad & mask
    if bool(bad.any()):
        raise IndexError(f"index out of range: an index is outside [{-size}, {size})")
    return idx


def minimum(*args):
    out = args[0]
    for a in args[1:]:
        out = torch.minimum(torch.as_tensor(out), torch.as_tensor(a))
    return out


def maximum(*args):
    out = args[0]
    for a in args[1:]:
        out = torch.maximum(torch.as_tensor(out), torch.as_tensor(a))
    return out


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def _uniform(seed, offset) -> torch.Tensor:
    """A counter-based hash of (seed, offset) as float32 in [0, 1)."""
    seed = torch.as_tensor(seed).to(torch.int64)
    offset = torch.as_tensor(offset).to(torch.int64)
    h = _fmix32((seed & _MASK32) ^ _fmix32(offset & _MASK32))
    h = _fmix32(h ^ ((offset >> 32) & _MASK32) ^ ((seed >> 32) & _MASK32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def rand(seed, offset) -> torch.Tensor:
    return _uniform(seed, offset)


def randn(seed, offset) -> torch.Tensor:
    offset = torch.as_tensor(offset).to(torch.int64)
    u1 = _uniform(seed, offset * 2).clamp_min(1e-7)
    u2 = _uniform(seed, offset * 2 + 1)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2 * math.pi * u2)


def _t(x):
    return torch.as_tensor(x)


ELEMENTWISE = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": torch.log, "log2": torch.log2, "log10": torch.log10,
    "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "sigmoid": torch.sigmoid,
    "reciprocal": torch.reciprocal, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "round": torch.round, "sign": torch.sign, "signbit": torch.signbit,
    "logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not, "isnan": torch.isnan,
    "isinf": torch.isinf, "isfinite": torch.isfinite, "lgamma": torch.lgamma,
    "digamma": torch.digamma, "trigamma": lambda x: torch.polygamma(1, x), "i0": torch.i0,
    "i0e": torch.special.i0e,
    "i1": torch.special.i1, "i1e": torch.special.i1e, "erfcx": torch.special.erfcx,
    "ndtri": torch.special.ndtri, "add": torch.add, "sub": torch.sub, "mul": torch.mul,
    "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(_t(a), _t(b), rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(_t(a), _t(b), rounding_mode="trunc"),
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
    "hypot": torch.hypot, "copysign": torch.copysign, "nextafter": torch.nextafter,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift": torch.bitwise_right_shift, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "logical_xor": torch.logical_xor, "eq": torch.eq,
    "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "zeta": torch.special.zeta,
}  # fmt: skip


def _tensor_args(fn):
    def wrapped(*args):
        return fn(*[torch.as_tensor(a) for a in args])

    wrapped.__name__ = getattr(fn, "__name__", "op")
    return wrapped


def scan(kind: str, value, src_dtype, grid: tuple, device=None) -> torch.Tensor:
    """The running ``kind`` of ``value`` (broadcast to ``grid``) along the last dim."""
    v = torch.as_tensor(value).to(device=device, dtype=src_dtype).expand(grid)
    if v.numel() == 0:
        return torch.zeros(grid, dtype=torch.int64 if kind.startswith("arg") else v.dtype)
    if kind == "sum":
        return v.cumsum(-1, dtype=src_dtype)
    if kind == "prod":
        return v.cumprod(-1, dtype=src_dtype)
    if kind == "logsumexp":
        return v.logcumsumexp(-1)
    if v.dtype == torch.bool:  # torch's cummax refuses bool: order False < True as 0 < 1
        out = scan(kind, v.to(torch.uint8), torch.uint8, grid, device)
        return out if kind.startswith("arg") else out.to(torch.bool)
    values, positions = v.cummax(-1) if kind.endswith("max") else v.cummin(-1)
    return positions if kind.startswith("arg") else values


def namespace() -> dict[str, object]:
    """The globals a rendered reference kernel runs with."""
    ns: dict[str, object] = {name: _tensor_args(fn) for name, fn in ELEMENTWISE.items()}
    ns.update(size_math.FUNCTIONS)  # what printed size expressions call (ceil_to_int ...)
    ns.update(
        torch=torch, index_var=index_var, flat=flat, load=load, store=store,
        store_add=store_add, reduction=reduction, scan=scan, constant=constant,
        index_expr=index_expr,
        to_dtype=to_dtype, where=where, masked=masked, indirect_indexing=indirect_indexing,
        minimum=minimum, maximum=maximum, rand=rand, randn=randn,
    )  # fmt: skip
    return ns
