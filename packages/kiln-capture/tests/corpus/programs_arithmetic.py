"""Arithmetic on tensors and Python numbers: operators, comparisons, unary ops, dtypes."""

import torch
from harness import Case, randint, randn


def add_mul(x, y):
    return x * 2 + y


def python_scalars(x):
    return x + 3.5 - 2


def reflected_sub(x):
    return 2 - x


def reflected_div(x):
    return 1 / (x.abs() + 1)


def mixed_int_float_constants(x):
    k = 3 // 2 + 1.5
    return x * k


def compare_tensors(x, y):
    return (x > y).float() + (x <= y).float() * 2


def compare_python_number(x):
    return x >= 0.1, x < -0.1, x == x, x != 0.5


def unary(x):
    return -x, abs(x), +x, ~(x > 0)


def pow_ops(x):
    return x**2, 2**x, x.abs() ** 0.5, torch.pow(x, 3)


def floor_div(x):
    return x // 0.7, torch.floor_divide(x, 2.0)


def modulo(x):
    return x % 1.5, torch.remainder(x, -0.5), torch.fmod(x, 0.5)


def matmul_operator(a, b):
    return a @ b


def matmul_vector(a, v):
    return a @ v, v @ a.T


def batched_matmul(a, b):
    return a @ b


def bitwise_bool(x, y):
    p, q = x > 0, y > 0
    return p & q, p | q, p ^ q, ~p


def int_tensor_ops(a, b):
    return a + b, a * 3, a // 2, a % 3, a - b


def int_true_division(a):
    return a / 2


def mixed_dtype_promotion(a, x):
    return a + x, a * 0.5, a.to(torch.float32) * x


def python_int_folding(x):
    n = 3
    k = n * n - 1
    return x * k + n


def chained_comparison_python(x):
    if 1 < 2 < 3 and not (3 < 2):
        return x + 1
    return x - 1


def torch_functions(x):
    return torch.sin(x) + torch.exp(-x.abs()) * torch.tanh(x)


def reductions(x):
    return x.sum(0), x.mean(), x.max(dim=1).values, x.amin(-1), x.prod(1)


def clamp_where(x, y):
    return torch.where(x > y, x, y).clamp(-0.5, 0.5)


def augmented_python_float(x):
    s = 1.0
    s *= 2.5
    s -= 0.5
    s /= 4
    return x * s


def pure_python(a, b):
    return a * b + 1


def pure_python_floats(a, b):
    return (a + b) / 2.0, a**b, a // b, a % b


def scalar_tensor(x):
    return x.sum() * 2 + x.mean()


def broadcasting(x, y):
    return x + y[0], x * y[:, :1]


def add_alpha(x, y):
    return x.add(y, alpha=2), torch.sub(x, y, alpha=0.5)


def softmax_expr(x):
    return torch.softmax(x, -1) * 3 - torch.log_softmax(x, 0)


def bool_sum(x):
    return (x > 0).sum(), (x > 0).float().mean()


def shifts(a):
    return a << 1, a >> 1


def bitwise_int(a, b):
    return a & b, a | 3, a ^ b, ~a


def python_builtin_max_min(x):
    return x * max(2, 3) - min(1.5, 4)


def loop_python_counter(x):
    i = 0
    for _ in range(4):
        i += 2
    return x + i


def int_input_scalar(x, n):
    return x * n + n


def float_input_scalar(x, s):
    return x * s - s / 2


def comparison_ops_chain(x):
    return ((x > -1) & (x < 1)).to(torch.float32).sum(0)


def rounding(x):
    return torch.round(x * 10) / 10, x.floor(), x.ceil(), x.trunc(), x.frac()


def sign_and_abs(x):
    return x.sign() * x.abs(), torch.sgn(x)


def lerp_addcmul(x, y, z):
    return torch.lerp(x, y, 0.3), torch.addcmul(x, y, z, value=0.5)


def integer_pow_mod_python(x):
    return x * (2**10 % 7) + pow(3, 2, 5)


def negative_floor_division_python(x):
    return x * (-7 // 2) + (-7 % 3)


def tensor_rpow_python_float(x):
    return 1.5**x


def dtype_cast_arith(x):
    y = x.double() * 2
    return y, y.float() + x, x.half().float()


def logical_ops(x, y):
    return torch.logical_and(x > 0, y > 0), torch.logical_not(x > 0), torch.logical_xor(x > 0, y)


CASES = [
    Case("add_mul", add_mul, randn((3, 4), (3, 4))),
    Case("python_scalars", python_scalars, randn((3, 4))),
    Case("reflected_sub", reflected_sub, randn((3, 4))),
    Case("reflected_div", reflected_div, randn((3, 4))),
    Case("mixed_int_float_constants", mixed_int_float_constants, randn((3, 4))),
    Case("compare_tensors", compare_tensors, randn((3, 4), (3, 4))),
    Case("compare_python_number", compare_python_number, randn((3, 4))),
    Case("unary", unary, randn((3, 4))),
    Case("pow_ops", pow_ops, randn((3, 4))),
    Case("floor_div", floor_div, randn((3, 4))),
    Case("modulo", modulo, randn((3, 4))),
    Case("matmul_operator", matmul_operator, randn((3, 4), (4, 5))),
    Case("matmul_vector", matmul_vector, randn((3, 4), (4,))),
    Case("batched_matmul", batched_matmul, randn((2, 3, 4), (2, 4, 5))),
    Case("bitwise_bool", bitwise_bool, randn((3, 4), (3, 4))),
    Case("int_tensor_ops", int_tensor_ops, randint((3, 4), (3, 4))),
    Case("int_true_division", int_true_division, randint((3, 4))),
    Case(
        "mixed_dtype_promotion",
        mixed_dtype_promotion,
        lambda: (torch.randint(1, 5, (3, 4)), torch.randn(3, 4)),
    ),
    Case("python_int_folding", python_int_folding, randn((3, 4))),
    Case("chained_comparison_python", chained_comparison_python, randn((3, 4))),
    Case("torch_functions", torch_functions, randn((3, 4))),
    Case("reductions", reductions, randn((3, 4))),
    Case("clamp_where", clamp_where, randn((3, 4), (3, 4))),
    Case("augmented_python_float", augmented_python_float, randn((3, 4))),
    # No tensor op: nothing to hand to the backend.
    Case("pure_python", pure_python, lambda: (3, 4), graphs=0),
    Case("pure_python_floats", pure_python_floats, lambda: (7.5, 2.0), graphs=0),
    Case("scalar_tensor", scalar_tensor, randn((3, 4))),
    Case("broadcasting", broadcasting, randn((3, 4), (3, 4))),
    Case("add_alpha", add_alpha, randn((3, 4), (3, 4))),
    Case("softmax_expr", softmax_expr, randn((3, 4))),
    Case("bool_sum", bool_sum, randn((3, 4))),
    Case("shifts", shifts, randint((3, 4))),
    Case("bitwise_int", bitwise_int, randint((3, 4), (3, 4))),
    Case("python_builtin_max_min", python_builtin_max_min, randn((3, 4))),
    Case("loop_python_counter", loop_python_counter, randn((3, 4))),
    Case("int_input_scalar", int_input_scalar, lambda: (torch.randn(3, 4), 3)),
    Case("float_input_scalar", float_input_scalar, lambda: (torch.randn(3, 4), 0.25)),
    Case("comparison_ops_chain", comparison_ops_chain, randn((3, 4))),
    Case("rounding", rounding, randn((3, 4))),
    Case("sign_and_abs", sign_and_abs, randn((3, 4))),
    Case("lerp_addcmul", lerp_addcmul, randn((3, 4), (3, 4), (3, 4))),
    Case("integer_pow_mod_python", integer_pow_mod_python, randn((3, 4))),
    Case("negative_floor_division_python", negative_floor_division_python, randn((3, 4))),
    Case("tensor_rpow_python_float", tensor_rpow_python_float, randn((3, 4))),
    Case("dtype_cast_arith", dtype_cast_arith, randn((3, 4)), tol={"atol": 1e-3, "rtol": 1e-3}),
    Case("logical_ops", logical_ops, randn((3, 4), (3, 4))),
]
