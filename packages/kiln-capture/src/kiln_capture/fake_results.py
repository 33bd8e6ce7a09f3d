"""Fake results of torch functions whose fake run needs a tensor's data on some torch
versions, though what they return does not: made from the arguments' metadata instead.

torch 2.11's ``quantile`` and ``nanquantile`` check that ``q`` lies in [0, 1] on its data,
a Python number too (torch 2.13 makes no such check on fake tensors): the result's size and
dtype follow from the arguments alone. A table entry is used only where the fake run itself
raises for want of data, and answers ``NotImplemented`` for a call that it cannot vouch for
(which then breaks the graph, as before).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException

# a call_function target, or a Tensor method's name -> its fake result from the arguments
FAKE_RESULTS: dict[object, Callable] = {}


def register_fake_result(*targets: object) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for target in targets:
            FAKE_RESULTS[target] = fn
        return fn

    return register


class _MetaErrorsOfCapture(logging.Filter):
    """Drops fake tensors' log of a meta kernel that raised while capture runs an op: the
    error is the user's (a shape mismatch), and it reaches them as eager raises it, alone
    (fake tensors logged it first, with a 20-line traceback)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        quiet = getattr(self.state, "depth", 0) > 0
        return not (quiet and str(record.msg).startswith("failed while attempting to run meta"))


_META_ERRORS = _MetaErrorsOfCapture()
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_META_ERRORS)


@contextlib.contextmanager
def meta_errors_unlogged():
    """While capture runs an op on fake tensors: no log of the meta kernel raising."""
    state = _META_ERRORS.state
    state.depth = getattr(state, "depth", 0) + 1
    try:
        yield
    finally:
        state.depth -= 1


def run_fake(kind: str, target, args: tuple, kwargs: dict):
    """``target(*args, **kwargs)`` on fake tensors (inside the fake mode), or its entry of
    :data:`FAKE_RESULTS` where the run needs data."""
    try:
        if kind == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        return target(*args, **kwargs)
    except DataDependentOutputException:
        fake = FAKE_RESULTS.get(target)
        result = NotImplemented if fake is None else fake(*args, **kwargs)
        if result is NotImplemented:
            raise
        return result


@register_fake_result(
    torch.quantile, torch.nanquantile, torch.Tensor.quantile, torch.Tensor.nanquantile
)
@register_fake_result("quantile", "nanquantile")
def quantile(x, q, dim=None, keepdim=False, *, interpolation="linear", out=None, axis=None):
    dim = axis if dim is None else dim  # torch takes NumPy's name too
    if out is not None or not isinstance(x, torch.Tensor):
        return NotImplemented
    if not isinstance(q, torch.Tensor) and not 0 <= q <= 1:
        return NotImplemented  # eager raises: the graph breaks there
    if dim is None:
        shape = [1] * x.ndim if keepdim else []
    else:
        shape = list(x.shape)
        if x.ndim:
            if keepdim:
                shape[dim] = 1
            else:
                del shape[dim]
    if isinstance(q, torch.Tensor) and q.ndim == 1:
        shape.insert(0, q.shape[0])
    return torch.empty(shape, dtype=x.dtype, device=x.device)
