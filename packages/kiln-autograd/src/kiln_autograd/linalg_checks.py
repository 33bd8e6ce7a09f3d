"""torch.linalg's error checks as a value in the graph, so that they survive functionalization.

``torch.linalg.solve`` (and ``inv``, ``cholesky``, ``lu_factor``) call ATen's
``_linalg_check_errors`` after the factorization: an op with no output whose only effect is
to raise on a singular or non positive-definite input. A functional graph cannot order such
an op. While a graph is traced, :class:`LinalgChecks` routes those functions through their
``_ex`` form (which returns the result and an ``info`` tensor) followed by
``kiln_autograd::linalg_checked``: the result passed through after the check, so the check
is data the graph keeps. It runs as an extern call and raises the error eager raises; its
gradient is the identity, and the ``_ex`` op's gradient is torch's formula.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


@torch.library.custom_op("kiln_autograd::linalg_checked", mutates_args=())
def linalg_checked(
    result: torch.Tensor, info: torch.Tensor, api_name: str, is_matrix: bool
) -> torch.Tensor:
    """``result`` (a copy) once ``info`` shows no error; else eager's error for ``api_name``."""
    torch.ops.aten._linalg_check_errors(info, api_name, is_matrix=is_matrix)
    return result.clone()


@linalg_checked.register_fake
def _(result, info, api_name, is_matrix):
    return torch.empty_like(result)


def _backward(ctx, grad):
    return grad, None, None, None


linalg_checked.register_autograd(_backward)


def _solve(A, B, *, left=True, out=None):
    result, info = torch.linalg.solve_ex(A, B, left=left)
    return linalg_checked(result, info, "torch.linalg.solve", A.dim() == 2)


def _inv(A, *, out=None):
    result, info = torch.linalg.inv_ex(A)
    return linalg_checked(result, info, "torch.linalg.inv", A.dim() == 2)


def _cholesky(A, *, upper=False, out=None):
    result, info = torch.linalg.cholesky_ex(A, upper=upper)
    return linalg_checked(result, info, "torch.linalg.cholesky", A.dim() == 2)


def _lu_factor(A, *, pivot=True, out=None):
    lu, pivots, info = torch.linalg.lu_factor_ex(A, pivot=pivot)
    return linalg_checked(lu, info, "torch.linalg.lu_factor", A.dim() == 2), pivots


CHECKED = {
    torch.linalg.solve: _solve,
    torch.linalg.inv: _inv,
    torch.linalg.cholesky: _cholesky,
    torch.linalg.lu_factor: _lu_factor,
}


class LinalgChecks(TorchFunctionMode):
    """Routes the functions of :data:`CHECKED` through their ``_ex`` form and a kept check."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        checked = CHECKED.get(func)
        if checked is not None and kwargs.get("out") is None:
            return checked(*args, **kwargs)
        return func(*args, **kwargs)
