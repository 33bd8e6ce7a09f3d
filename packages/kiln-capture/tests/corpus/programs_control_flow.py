"""Branches, loops, generators and early returns.

Branches on tensor values graph-break: the graph before the branch computes the condition, the
branch runs natively, and the code after it is captured again. Conditions here hold for every
random input (e.g. ``x.abs().sum() > 0``), so the second call takes the same path.
"""

import sys

import torch
from harness import Case, randn


def branch_on_shape(x):
    if x.shape[0] == 3:
        return x * 2
    return x * 3


def branch_on_ndim(x):
    if x.ndim > 1:
        x = x.flatten()
    return x.sum()


def branch_on_python_flag(x, flag):
    if flag:
        return x + 1
    return x - 1


def branch_on_none(x, y=None):
    if y is None:
        y = torch.ones_like(x)
    return x * y


def branch_on_optional_given(x, y):
    return branch_on_none(x, y)


def branch_on_string_mode(x, mode):
    if mode == "mean":
        return x.mean()
    if mode == "sum":
        return x.sum()
    return x


def branch_on_tensor_value(x):
    if x.abs().sum() > 0:  # noqa: SIM108 - the statement form is the point
        y = x + 1
    else:
        y = x - 1
    return y * 2


def branch_on_tensor_value_else(x):
    if x.abs().max() < 0:
        return x * 100
    return x.cos()


def branch_on_tensor_value_return_input(x):
    y = x * 2
    if y.abs().sum() > 0:
        return x
    return y


def branch_on_random_sign(x):
    if x.sum() > 0:
        return x * 2
    return x * -2


def branch_bool_tensor_and(x):
    s = x.abs().sum()
    if s > 0 and s < 1e6:
        return x.exp()
    return x


def ternary_on_shape(x):
    return x * 2 if x.shape[-1] > 3 else x


def ternary_on_tensor(x):
    return x.sin() if (x * x).sum() >= 0 else x.cos()


def for_range(x):
    for i in range(4):
        x = x * 0.5 + i
    return x


def for_list_of_tensors(xs):
    acc = torch.zeros(3)
    for t in xs:
        acc = acc + t.relu()
    return acc


def for_tensor_first_dim(x):
    acc = x[0] * 0
    for row in x:
        acc = acc + row * row
    return acc


def for_nested(x):
    for i in range(2):
        for j in range(3):
            x = x + i * j
    return x


def for_break(x):
    for i in range(10):
        if i == 3:
            break
        x = x * 2
    return x


def for_continue(x):
    for i in range(6):
        if i % 2:
            continue
        x = x + i
    return x


def for_else(x):
    for i in range(3):
        if i == 10:
            break
    else:
        x = x + 100
    return x


def while_loop(x):
    i = 0
    while i < 4:
        x = x.tanh() + i
        i += 1
    return x


def while_break(x):
    n = 0
    while True:
        n += 1
        x = x * 1.5
        if n >= 3:
            break
    return x


def while_on_tensor_value(x):
    x = x / x.norm() * 10
    steps = 0
    while x.norm() > 1:
        x = x / 2
        steps += 1
    return x, steps


def while_on_tensor_value_no_counter(x):
    x = x / x.norm() * 10
    while x.norm() > 1:
        x = x / 2
    return x


def generator_sum(x):
    return sum(x * i for i in range(3))


def generator_any_all(x):
    flags = [True, False, True]
    return x * any(f for f in flags) + all(f for f in flags)


def count_up(n):
    for i in range(n):
        yield i * 2


def squares(xs):
    for t in xs:
        yield t * t


def generator_function_list(x):
    return [x + v for v in list(count_up(3))]


def generator_function_for(x):
    out = x
    for v in count_up(4):
        out = out + v
    return out


def generator_function_tensors(xs):
    return torch.stack(list(squares(xs))).sum(0)


def generator_yield_from(x):
    def gen():
        yield from count_up(2)
        yield 10

    return [x * v for v in gen()]


def early_return_on_flag(x, skip):
    if skip:
        return x
    y = x * 2
    return y + 1


def early_return_in_loop(x):
    for i in range(5):
        x = x + 1
        if i == 2:
            return x * 10
    return x


def early_return_on_tensor(x):
    y = x.exp()
    if y.min() > 0:
        return y.log()
    return y


def nested_branches(x, a, b):
    if a:
        if b:
            return x * 4
        return x * 3
    return x


def loop_with_accumulator_list(x):
    outs = []
    for i in range(3):
        outs.append(x * i)
    return torch.cat(outs)


def loop_over_dict(d):
    acc = 0
    for key in ["b", "a"]:
        acc = acc + d[key]
    return acc


def loop_zip_enumerate(xs, ws):
    total = 0
    for i, (t, w) in enumerate(zip(xs, ws, strict=True)):
        total = total + t * w * i
    return total


def branch_on_dtype(x):
    if x.dtype == torch.float32:
        return x.double()
    return x


def branch_on_requires_grad(x):
    if x.requires_grad:
        return x * 2
    return x * 3


def loop_shape_bound(x):
    for i in range(x.shape[0]):
        x[i] = x[i] * (i + 1)
    return x


def branch_on_len(xs):
    if len(xs) > 2:
        return xs[0] + xs[2]
    return xs[0]


def two_tensor_branches(x):
    if x.abs().sum() > 0:
        x = x + 1
    if (x * x).sum() >= 0:
        x = x * 2
    return x


def match_statement(x, kind):
    match kind:
        case "double":
            return x * 2
        case "neg":
            return -x
        case _:
            return x


def tensor_bool_of_numel(x):
    if x.numel():
        return x + 1
    return x


def chained_comparison_shapes(x):
    if 1 < x.shape[0] <= 3 < x.shape[1]:
        return x.sum()
    return x.mean()


def loop_range_len(xs):
    out = xs[0]
    for i in range(1, len(xs)):
        out = out * xs[i]
    return out


CASES = [
    Case("branch_on_shape", branch_on_shape, randn((3, 4))),
    Case("branch_on_ndim", branch_on_ndim, randn((3, 4))),
    Case("branch_on_python_flag_true", branch_on_python_flag, lambda: (torch.randn(3), True)),
    Case("branch_on_python_flag_false", branch_on_python_flag, lambda: (torch.randn(3), False)),
    Case("branch_on_none", branch_on_none, randn((3,))),
    Case("branch_on_optional_given", branch_on_optional_given, randn((3,), (3,))),
    Case("branch_on_string_mode", branch_on_string_mode, lambda: (torch.randn(3), "sum")),
    Case("branch_on_tensor_value", branch_on_tensor_value, randn((3,)), graphs=2),
    Case("branch_on_tensor_value_else", branch_on_tensor_value_else, randn((3,)), graphs=2),
    # The taken branch returns an input unchanged: the resume part has no op, so only the
    # graph computing the condition is compiled.
    Case("branch_return_input", branch_on_tensor_value_return_input, randn((3,)), graphs=1),
    # The second call's inputs may take the other branch, which is then captured anew.
    Case("branch_on_random_sign", branch_on_random_sign, randn((3,)), graphs=2, recompiles_ok=True),
    Case("branch_bool_tensor_and", branch_bool_tensor_and, randn((3,)), graphs=3),
    Case("ternary_on_shape", ternary_on_shape, randn((3, 4))),
    Case("ternary_on_tensor", ternary_on_tensor, randn((3,)), graphs=2),
    Case("for_range", for_range, randn((3,))),
    Case("for_list_of_tensors", for_list_of_tensors, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("for_tensor_first_dim", for_tensor_first_dim, randn((4, 3))),
    Case("for_nested", for_nested, randn((3,))),
    Case("for_break", for_break, randn((3,))),
    Case("for_continue", for_continue, randn((3,))),
    Case("for_else", for_else, randn((3,))),
    Case("while_loop", while_loop, randn((3,))),
    Case("while_break", while_break, randn((3,))),
    # Each iteration breaks on the condition and resumes in the same resume function, whose
    # capture is reused: one graph before the loop, one for the loop body. From 3.12 CPython
    # tests a while condition twice (before the loop and at its end): two resume points.
    Case(
        "while_tensor_value",
        while_on_tensor_value_no_counter,
        randn((3,)),
        graphs=2 if sys.version_info < (3, 12) else 3,
        oracle_graphs=2,
    ),
    # As above, but the body also bumps a Python int. The resume function is first captured with
    # steps == 0, then recaptured once with steps dynamic (dynamic=None: automatic dynamic
    # after a changed int), and that capture serves the remaining iterations. From 3.12 the
    # condition is tested in two places: one more resume point.
    Case(
        "while_tensor_value_counter",
        while_on_tensor_value,
        randn((3,)),
        graphs=3 if sys.version_info < (3, 12) else 4,
        oracle_graphs=3,
    ),
    Case("generator_sum", generator_sum, randn((3,))),
    Case("generator_any_all", generator_any_all, randn((3,))),
    Case("generator_function_list", generator_function_list, randn((3,))),
    Case("generator_function_for", generator_function_for, randn((3,))),
    Case(
        "generator_function_tensors",
        generator_function_tensors,
        lambda: ([torch.randn(3) for _ in range(3)],),
    ),
    Case("generator_yield_from", generator_yield_from, randn((3,))),
    # Returns the input untouched: no graph.
    Case(
        "early_return_on_flag_skip", early_return_on_flag, lambda: (torch.randn(3), True), graphs=0
    ),
    Case("early_return_on_flag", early_return_on_flag, lambda: (torch.randn(3), False)),
    Case("early_return_in_loop", early_return_in_loop, randn((3,))),
    Case("early_return_on_tensor", early_return_on_tensor, randn((3,)), graphs=2),
    Case("nested_branches", nested_branches, lambda: (torch.randn(3), True, False)),
    Case("loop_with_accumulator_list", loop_with_accumulator_list, randn((3,))),
    Case("loop_over_dict", loop_over_dict, lambda: ({"a": torch.randn(3), "b": torch.randn(3)},)),
    Case(
        "loop_zip_enumerate",
        loop_zip_enumerate,
        lambda: ([torch.randn(2) for _ in range(3)], [torch.randn(2) for _ in range(3)]),
    ),
    Case("branch_on_dtype", branch_on_dtype, randn((3,))),
    Case("branch_on_requires_grad", branch_on_requires_grad, randn((3,), requires_grad=True)),
    Case("loop_shape_bound", loop_shape_bound, randn((3, 2))),
    Case("branch_on_len", branch_on_len, lambda: ([torch.randn(2) for _ in range(3)],)),
    Case("two_tensor_branches", two_tensor_branches, randn((3,)), graphs=3),
    Case("match_statement", match_statement, lambda: (torch.randn(3), "neg")),
    Case("tensor_bool_of_numel", tensor_bool_of_numel, randn((3,))),
    Case("chained_comparison_shapes", chained_comparison_shapes, randn((3, 4))),
    Case("loop_range_len", loop_range_len, lambda: ([torch.randn(2) for _ in range(4)],)),
]
