"""Helpers the generated host program calls (allocation, views, checks, seeds)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "assert_size_stride",
    "bind_op",
    "empty_strided",
    "SEED_HIGH",
    "reinterpret",
    "view_layout",
]


def empty_strided(size: Sequence[int], stride: Sequence[int], dtype, device) -> torch.Tensor:
    return torch.empty_strided(tuple(size), tuple(stride), dtype=dtype, device=device)


def bind_op(op: torch._ops.OpOverload):
    """What the host program calls for ``op``: its compiled entry point, without the Python
    frame of ``OpOverload.__call__`` (the same function, one call cheaper)."""
    return getattr(op, "_op", op)


def reinterpret(t: torch.Tensor, size, stride, offset: int = 0) -> torch.Tensor:
    """A view of ``t``'s storage with ``size``/``stride``, ``offset`` elements past ``t``'s."""
    return torch.as_strided(t, tuple(size), tuple(stride), t.storage_offset() + offset)


def assert_size_stride(t: torch.Tensor, size: tuple, stride: tuple, what: str) -> None:
    """Fail clearly when a tensor's layout differs from the one the graph was compiled for."""
    if t.shape == size and t.stride() == stride:  # the common case, checked first: cheap
        return
    if tuple(t.shape) != tuple(size):
        raise ValueError(
            f"{what} has size {tuple(t.shape)} but the graph was compiled for {tuple(size)}: "
            "compile again for this shape (or mark the dimension dynamic when tracing)"
        )
    for dim, (n, got, want) in enumerate(zip(t.shape, t.stride(), stride, strict=True)):
        if n > 1 and got != want:
            raise ValueError(
                f"{what} has stride {tuple(t.stride())} but the graph was compiled for "
                f"{tuple(stride)} (dimension {dim}): pass a tensor with that layout "
                "(e.g. .contiguous()) or compile again"
            )


def view_layout(op, size, stride, offset, *args, **kwargs) -> tuple[tuple, tuple, int]:
    """(size, stride, storage offset) of ``op``'s view of a tensor with this layout, worked
    out on a meta tensor: how the host program learns the size of a view bounded by a
    number read from tensor data (``x[: n.item()]``)."""
    base = torch.empty_strided(tuple(size), tuple(stride), device="meta")
    view = op(base.as_strided(tuple(size), tuple(stride), offset), *args, **kwargs)
    return tuple(view.shape), view.stride(), view.storage_offset()


SEED_HIGH = 2**31 - 1  # seeds are drawn from [0, SEED_HIGH)


def match_layout(t: torch.Tensor, size, stride, what: str) -> torch.Tensor:
    """An extern op's result in the layout the graph was compiled for: ``t`` itself, or a
    copy where the op's kernel chose other strides than its meta function said (the values
    are the same, the kernels that read it expect the compiled strides)."""
    if t.shape == size and t.stride() == stride:  # the common case, checked first: cheap
        return t
    if tuple(t.shape) == tuple(size) and all(
        n <= 1 or got == want for n, got, want in zip(t.shape, t.stride(), stride, strict=True)
    ):
        return t
    if tuple(t.shape) != tuple(size):
        assert_size_stride(t, size, stride, what)  # raises, naming the size
    out = torch.empty_strided(tuple(size), tuple(stride), dtype=t.dtype, device=t.device)
    return out.copy_(t)
