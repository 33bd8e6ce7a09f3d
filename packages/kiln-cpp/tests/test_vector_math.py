"""The vectorisable float functions (``kiln_cpp.vecmath``) against float64 references."""

import math

import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_loopir.testing import compile_fn

# max relative error against float64, over the finite results a float can hold
BOUNDS = {"exp": 2e-7, "tanh": 2e-7, "sigmoid": 2e-7, "erf": 4e-7}


def _grid() -> torch.Tensor:
    return torch.cat(
        [
            torch.linspace(-110, 110, 40001),
            torch.linspace(-3, 3, 20001),
            torch.logspace(-30, 1, 2000),
            -torch.logspace(-30, 1, 2000),
            torch.randn(5000) * 4,
        ]
    ).float()


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_accuracy_over_the_float_range(name):
    fn = getattr(torch, name)
    x = _grid()
    compiled = compile_fn(lambda a: fn(a), [x], codegen=CppCodegen())
    assert "kiln::" + name + "_f(" in compiled.kernels[0].source
    got = compiled(x)[0].double()
    ref = fn(x.double())
    normal = (ref.abs() > torch.finfo(torch.float32).tiny) & ref.float().isfinite()
    rel = (got - ref).abs()[normal] / ref.abs()[normal]
    assert rel.max().item() <= BOUNDS[name], f"{name} at {x[normal][rel.argmax()].item()}"
    # results too small for a normal float: no further off than eager's
    tiny = ~normal & ref.float().isfinite()
    eager_error = (fn(x).double() - ref).abs()
    assert ((got - ref).abs()[tiny] <= eager_error[tiny] + 2e-45).all()


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_special_values_as_torch(name):
    fn = getattr(torch, name)
    x = torch.tensor(
        [math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-40, -1e-40, 88.7, 89.0, -88.0, -104.0, 1e30]
    )
    compiled = compile_fn(lambda a: fn(a), [x], codegen=CppCodegen())
    torch.testing.assert_close(compiled(x)[0], fn(x), equal_nan=True, rtol=2e-7, atol=1e-44)
