"""The math and operator modules on Python numbers and tensors."""

import functools
import math
import operator

import torch
from harness import Case, randn


def math_sqrt_pi(x):
    return x * math.sqrt(2.0) + math.pi


def math_log_exp(x):
    return x * math.log(10.0) - math.exp(0.5) + math.log2(8) + math.log10(1000)


def math_floor_ceil(x):
    return x * math.floor(2.7) + math.ceil(2.1), math.floor(-1.5)


def math_trig(x):
    return x * math.cos(math.pi / 3) + math.sin(0.0) + math.atan2(1.0, 1.0)


def math_inf_isfinite(x):
    bound = math.inf
    out = x.clamp(max=bound)
    return out, math.isfinite(1.0), math.isinf(bound), math.isnan(math.nan)


def math_gcd_prod(x):
    return x * math.gcd(12, 18) + math.prod([1, 2, 3]) + math.factorial(4)


def math_shape_arith(x):
    n = math.prod(x.shape)
    scale = 1 / math.sqrt(x.shape[-1])
    return x.reshape(n) * scale


def math_on_input_float(x, s):
    return x * math.sqrt(s) + math.log(s)


def math_e_tau(x):
    return x * math.e + math.tau, math.copysign(2.0, -1.0)


def math_fabs_trunc(x):
    return x + math.fabs(-2.5) + math.trunc(3.9) + math.hypot(3.0, 4.0)


def math_isclose_branch(x):
    if math.isclose(0.1 + 0.2, 0.3):
        return x + 1
    return x - 1


def operator_add_mul(x, y):
    return operator.add(x, y), operator.mul(x, 2), operator.sub(y, x), operator.truediv(x, 2)


def operator_getitem(xs, d):
    return operator.getitem(xs, 1) + operator.getitem(d, "a")


def operator_itemgetter(xs):
    first, third = operator.itemgetter(0, 2)(xs)
    return first * third, operator.itemgetter(1)(xs)


def operator_itemgetter_dict(d):
    return operator.itemgetter("a")(d) * 2


class Holder:
    def __init__(self, w, b):
        self.w = w
        self.b = b


def operator_attrgetter(h, x):
    w, b = operator.attrgetter("w", "b")(h)
    return x * w + b


def operator_attrgetter_tensor(x):
    return operator.attrgetter("shape")(x), operator.attrgetter("T")(x) * 2


def operator_comparisons(x, y):
    return operator.lt(x, y), operator.ge(x, 0), operator.eq(3, 3)


def operator_neg_pos_abs(x):
    return operator.neg(x), operator.pos(x), operator.abs(x), operator.invert(x > 0)


def operator_matmul_pow(a, b):
    return operator.matmul(a, b), operator.pow(a, 2), operator.floordiv(a, 0.3)


def operator_inplace(x, y):
    z = x.clone()
    z = operator.iadd(z, y)
    z = operator.imul(z, 2)
    return z


def operator_reduce(xs):
    return functools.reduce(operator.add, xs), functools.reduce(operator.mul, [1, 2, 3, 4])


def operator_contains_not(x):
    out = x
    if operator.contains([1, 2], 2):
        out = out + 1
    if operator.not_(False):
        out = out * 2
    return out


def operator_setitem_delitem(d, x):
    operator.setitem(d, "y", x * 3)
    operator.delitem(d, "a")
    return x + 1


def operator_and_or_bool(x, y):
    return operator.and_(x > 0, y > 0), operator.or_(x > 0, y > 0), operator.xor(x > 0, y > 0)


def operator_index_truth(x):
    return x * operator.index(3), operator.truth([1])


def operator_methodcaller(x):
    return operator.methodcaller("sum", 0)(x), operator.methodcaller("view", -1)(x)


def operator_map_over_pairs(xs, ys):
    return list(map(operator.mul, xs, ys))


def math_loop_accumulate(x):
    acc = 0.0
    for i in range(1, 4):
        acc += math.log(i) + math.sqrt(i)
    return x * acc


def math_pure_python(a):
    return math.sqrt(a) + math.floor(a) + math.ceil(a)


def math_degrees_radians(x):
    return x * math.radians(180.0) + math.degrees(math.pi)


def math_pow_fmod(x):
    return x * math.pow(2.0, 3) + math.fmod(7.0, 3.0) + math.exp(math.log(2.0))


CASES = [
    Case("math_sqrt_pi", math_sqrt_pi, randn((3,))),
    Case("math_log_exp", math_log_exp, randn((3,))),
    Case("math_floor_ceil", math_floor_ceil, randn((3,))),
    Case("math_trig", math_trig, randn((3,))),
    Case("math_inf_isfinite", math_inf_isfinite, randn((3,))),
    Case("math_gcd_prod", math_gcd_prod, randn((3,))),
    Case("math_shape_arith", math_shape_arith, randn((3, 4))),
    Case("math_on_input_float", math_on_input_float, lambda: (torch.randn(3), 2.0)),
    Case("math_e_tau", math_e_tau, randn((3,))),
    Case("math_fabs_trunc", math_fabs_trunc, randn((3,))),
    Case("math_isclose_branch", math_isclose_branch, randn((3,))),
    Case("operator_add_mul", operator_add_mul, randn((3,), (3,))),
    Case(
        "operator_getitem",
        operator_getitem,
        lambda: ([torch.randn(3), torch.randn(3)], {"a": torch.randn(3)}),
    ),
    Case("operator_itemgetter", operator_itemgetter, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("operator_itemgetter_dict", operator_itemgetter_dict, lambda: ({"a": torch.randn(3)},)),
    Case(
        "operator_attrgetter",
        operator_attrgetter,
        lambda: (Holder(torch.randn(3), torch.randn(3)), torch.randn(3)),
    ),
    Case("operator_attrgetter_tensor", operator_attrgetter_tensor, randn((3, 4))),
    Case("operator_comparisons", operator_comparisons, randn((3,), (3,))),
    Case("operator_neg_pos_abs", operator_neg_pos_abs, randn((3,))),
    Case("operator_matmul_pow", operator_matmul_pow, randn((3, 3), (3, 3))),
    Case("operator_inplace", operator_inplace, randn((3,), (3,))),
    Case("operator_reduce", operator_reduce, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("operator_contains_not", operator_contains_not, randn((3,))),
    # torch.compile graph-breaks on operator.setitem and operator.delitem of a dict (no handler
    # for them): graphs before and after. They are plain dict mutations: Kiln keeps one graph.
    Case(
        "operator_setitem_delitem",
        operator_setitem_delitem,
        lambda: ({"a": torch.randn(3)}, torch.randn(3)),
        oracle_graphs=2,
    ),
    Case("operator_and_or_bool", operator_and_or_bool, randn((3,), (3,))),
    Case("operator_index_truth", operator_index_truth, randn((3,))),
    Case("operator_methodcaller", operator_methodcaller, randn((3, 4))),
    Case(
        "operator_map_over_pairs",
        operator_map_over_pairs,
        lambda: ([torch.randn(2) for _ in range(3)], [torch.randn(2) for _ in range(3)]),
    ),
    Case("math_loop_accumulate", math_loop_accumulate, randn((3,))),
    # Python numbers only: no graph.
    Case("math_pure_python", math_pure_python, lambda: (6.25,), graphs=0),
    Case("math_degrees_radians", math_degrees_radians, randn((3,))),
    Case("math_pow_fmod", math_pow_fmod, randn((3,))),
]
