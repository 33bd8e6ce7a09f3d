"""Torch functions rewritten above autograd while a graph is analysed and traced.

The decomposition table applies below autograd: an op keeps its own derivative formula, and
one that has none cannot be traced for gradients. While :class:`PreAutogradDecompositions`
is active (in every run of a lifted module, :mod:`kiln_autograd.lift`), a function of
:data:`PRE_AUTOGRAD_DECOMPOSITIONS` is replaced by torch functions that have formulas and
give eager's values and gradients:

- ``aminmax`` is ``amin`` and ``amax`` (torch 2.11 has no derivative for ``aminmax``;
  2.13's is theirs, so graphs are the same on both);
- ``quantile`` and ``nanquantile`` are ATen's algorithm (sort, ranks, gather, lerp) without
  its check that ``q`` lies in [0, 1], which torch 2.11 makes on the data of ``q``, a
  Python number's too (``aten.equal``, which no graph can hold). A number is checked here;
  a tensor ``q`` on the CPU (where ATen checks it) passes through
  ``kiln_autograd::quantile_q_checked``, an extern call that raises eager's error, so the
  check is data the graph keeps (as :mod:`kiln_autograd.linalg_checks` does).

A replacement returns ``NotImplemented`` for calls it leaves to the function: what it does
not handle, and errors, which the function raises as eager does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

# torch function (as __torch_function__ receives it) -> its replacement, same signature
PRE_AUTOGRAD_DECOMPOSITIONS: dict[Callable, Callable] = {}


def register_pre_autograd(*funcs: Callable) -> Callable[[Callable], Callable]:
    """Register a replacement for the torch functions ``funcs`` (see the module docstring)."""

    def register(fn: Callable) -> Callable:
        for func in funcs:
            PRE_AUTOGRAD_DECOMPOSITIONS[func] = fn
        return fn

    return register


class PreAutogradDecompositions(TorchFunctionMode):
    """Routes the functions of :data:`PRE_AUTOGRAD_DECOMPOSITIONS` to their replacements
    (a call that writes into ``out=`` keeps the function)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        replacement = PRE_AUTOGRAD_DECOMPOSITIONS.get(func)
        if replacement is not None and kwargs.get("out") is None:
            result = replacement(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)


@register_pre_autograd(torch.aminmax, torch.Tensor.aminmax)
def aminmax(x: torch.Tensor, *, dim: int | None = None, keepdim: bool = False):
    dims = () if dim is None else dim
    return torch.return_types.aminmax(
        (torch.amin(x, dims, keepdim=keepdim), torch.amax(x, dims, keepdim=keepdim))
    )


QUANTILE_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


@torch.library.custom_op("kiln_autograd::quantile_q_checked", mutates_args=())
def quantile_q_checked(q: torch.Tensor) -> torch.Tensor:
    """``q`` (a copy) once all its values lie in [0, 1]; else eager's error."""
    if not bool(((q >= 0) & (q <= 1)).all()):
        raise RuntimeError("quantile() q values must be in the range [0, 1]")
    return q.clone()


@quantile_q_checked.register_fake
def _(q):
    return torch.empty_like(q)


quantile_q_checked.register_autograd(lambda ctx, grad: grad)


@register_pre_autograd(torch.quantile, torch.Tensor.quantile)
def quantile(x, q, dim=None, keepdim=False, *, interpolation="linear", axis=None):
    dim = axis if dim is None else dim  # torch takes NumPy's name too
    return _quantile(x, q, dim, keepdim, interpolation, ignore_nan=False)


@register_pre_autograd(torch.nanquantile, torch.Tensor.nanquantile)
def nanquantile(x, q, dim=None, keepdim=False, *, interpolation="linear", axis=None):
    dim = axis if dim is None else dim  # torch takes NumPy's name too
    return _quantile(x, q, dim, keepdim, interpolation, ignore_nan=True)


def _quantile(x, q, dim, keepdim, interpolation, ignore_nan):
    """ATen's quantile_compute, step for step (the same ops, so the same roundings)."""
    if not _quantile_handles(x, q, dim, interpolation):
        return NotImplemented
    scalar_q = not isinstance(q, torch.Tensor) or q.ndim == 0
    if isinstance(q, torch.Tensor):
        q = q.reshape(-1)
        if q.device.type == "cpu":
            q = quantile_q_checked(q)
    else:  # ATen makes a number a tensor of the input's dtype first
        q = torch.full((1,), q, dtype=x.dtype, device=x.device)
    if dim is None:
        values = x.flatten().sort().values
        shape = [1] * x.ndim if keepdim else []
    else:
        dim = dim % max(x.ndim, 1)
        values = x.unsqueeze(-1).transpose(dim, -1).sort().values
        shape = list(x.shape)
        if x.ndim:
            if keepdim:
                shape[dim] = 1
            else:
                del shape[dim]
    # (*reduced shape, n), sorted along the last dimension
    values = values.reshape(*shape, values.shape[-1])
    if ignore_nan:
        # ranks among the values that are not NaN; all NaN: rank 0, a NaN result
        ranks = q * (values.isnan().logical_not().sum(-1, keepdim=True) - 1)
        ranks = ranks.masked_fill(ranks < 0, 0)
    else:
        # a NaN anywhere: the last rank, where the sort put NaN
        last = values.shape[-1] - 1
        ranks, has_nan = torch.broadcast_tensors(q * last, values.isnan().any(-1, keepdim=True))
        ranks = ranks.masked_fill(has_nan, last)
    if interpolation == "lower":
        ranks = ranks.floor()
    elif interpolation == "higher":
        ranks = ranks.ceil()
    elif interpolation == "nearest":
        ranks = ranks.round()
    below = ranks.long()
    result = values.gather(-1, below)
    if interpolation in ("linear", "midpoint"):
        weights = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - below
        result = result.lerp(values.gather(-1, ranks.ceil().long()), weights)
    # (*reduced shape, len(q)) -> (len(q), *reduced shape)
    result = result.squeeze(-1) if scalar_q else result.movedim(-1, 0)
    return result


def _quantile_handles(x, q, dim, interpolation) -> bool:
    """Whether a quantile call is one eager computes (no error) and :func:`_quantile` takes."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.float64):
        return False
    if x.numel() == 0 or interpolation not in QUANTILE_INTERPOLATIONS:
        return False
    if not (dim is None or isinstance(dim, int)) or (
        dim is not None and x.ndim == 0 and dim not in (0, -1)
    ):
        return False
    if dim is not None and x.ndim and not -x.ndim <= dim < x.ndim:
        return False
    if isinstance(q, torch.Tensor):
        return q.dtype == x.dtype and q.ndim <= 1 and q.device == x.device
    return isinstance(q, (int, float)) and not isinstance(q, bool) and 0 <= q <= 1
