"""The vectorisable float functions (``kiln_cpp.vecmath``) against float64 references, and
libm's functions on whole vectors against eager."""

import math

import pytest
import torch

from kiln_cpp import CppCodegen, build
from kiln_cpp.vecmath import LIBM_UNARY
from kiln_loopir.testing import check_against_eager, compile_fn

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


_DOMAINS = {
    "log": (1e-3, 50.0), "log2": (1e-3, 50.0), "log10": (1e-3, 50.0), "log1p": (-0.9, 50.0),
    "asin": (-1.0, 1.0), "acos": (-1.0, 1.0), "atanh": (-0.99, 0.99), "acosh": (1.0, 50.0),
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(LIBM_UNARY))
def test_libm_functions_run_on_whole_vectors_within_eager_tolerance(name, dtype):
    lo, hi = _DOMAINS.get(name, (-20.0, 20.0))
    x = (torch.rand(4099, dtype=torch.float64) * (hi - lo) + lo).to(dtype)  # a tail too
    codegen = CppCodegen()
    compiled = check_against_eager(lambda a: getattr(torch, name)(a) * 2, [x], codegen=codegen)
    assert f"kiln_vm_{name}" in compiled.kernels[0].source
    if "-DKILN_LIBMVEC" in build.optional_flags(build.compiler()):
        # the loop calls libmvec's whole-vector variant (_ZGV<isa><mask><lanes>v_<name>)
        assert b"_ZGV" in codegen.last_library.read_bytes()


@pytest.mark.parametrize("name", ["atan2", "hypot", "pow"])
def test_libm_binary_functions_within_eager_tolerance(name):
    x, y = torch.rand(1000) * 5 + 0.1, torch.randn(1000) * 3
    check_against_eager(lambda a, b: getattr(torch, name)(a, b), [x, y], codegen=CppCodegen())


def test_sin_and_cos_of_one_value_stay_two_vector_calls():
    x = torch.randn(2000) * 100  # large arguments: libm's own range reduction
    codegen = CppCodegen()
    check_against_eager(lambda a: a.sin() * a.cos(), [x], codegen=codegen)
    assert b"sincosf" not in codegen.last_library.read_bytes()
