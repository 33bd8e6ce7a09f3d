"""Python builtins: isinstance, len, range, enumerate, zip, map, filter, getattr, min, max..."""

import collections
import itertools

import torch
from harness import Case, randn


class Box:
    def __init__(self, value, scale=2):
        self.value = value
        self.scale = scale


def isinstance_tensor(x):
    if isinstance(x, torch.Tensor):
        return x + 1
    return x


def isinstance_tuple_types(x, n):
    a = x * 2 if isinstance(n, (int, float)) else x
    b = a - 1 if isinstance(n, str) else a
    return b


def isinstance_list_input(xs):
    if isinstance(xs, list):
        return xs[0] * len(xs)
    return xs[0]


def len_list_and_tensor(xs, x):
    return x * len(xs) + len(x)


def range_with_step(x):
    out = x
    for i in range(1, 10, 3):
        out = out + i
    return out


def range_reversed(x):
    return [x * i for i in range(3, 0, -1)]


def range_len_index(x):
    r = range(2, 12, 2)
    return x * len(r) + r[2] + r[-1]


def enumerate_list(xs):
    return sum(t * i for i, t in enumerate(xs))


def enumerate_start(xs):
    return [t + i for i, t in enumerate(xs, start=10)]


def zip_two(xs, ys):
    return [a * b for a, b in zip(xs, ys, strict=True)]


def zip_three_ranges(x):
    return [x * (a + b + c) for a, b, c in zip(range(3), [4, 5, 6], (7, 8, 9), strict=True)]


def map_lambda(xs):
    return list(map(lambda t: t * 2, xs))


def map_builtin(x):
    return list(map(abs, [x, -x])), list(map(int, ["1", "2"]))


def filter_lambda(x):
    vals = list(filter(lambda v: v % 2 == 0, range(7)))
    return x * sum(vals)


def getattr_default(x):
    b = Box(x)
    return getattr(b, "value") * getattr(b, "missing", 3)  # noqa: B009


def hasattr_check(x):
    b = Box(x)
    out = x
    if hasattr(b, "scale"):
        out = out * b.scale
    if not hasattr(b, "nope"):
        out = out + 1
    return out


def setattr_object(box, x):
    setattr(box, "scale", 5)  # noqa: B010
    box.value = x * 2
    return box.value + box.scale


def min_max_tensors(x, y):
    return torch.maximum(x, y), torch.minimum(x, y), max(x.shape[0], 2)


def min_max_python(x):
    return x * min(3, 1, 2) + max([4, 9, 2]) + min((5.5, 2.5))


def max_with_key(x):
    words = ["aa", "b", "cccc"]
    longest = max(words, key=len)
    return x * len(longest)


def sum_list_tensors(xs):
    return sum(xs)


def sum_with_start(xs, x):
    return sum(xs, x)


def abs_builtin(x):
    return abs(x) + abs(-3)


def sorted_python(x):
    vals = sorted([3, 1, 2], reverse=True)
    return x * vals[0] + vals[-1], vals


def sorted_key(x):
    pairs = sorted([("b", 2), ("a", 3), ("c", 1)], key=lambda p: p[1])
    return x * pairs[0][1], [p[0] for p in pairs]


def any_all_python(x):
    out = x
    if any([False, True]):
        out = out + 1
    if all(v > 0 for v in (1, 2, 3)):
        out = out * 2
    return out


def int_float_bool_constants(x):
    return x * int("3") + float("0.5") + int(2.9) + bool(1) + float(2)


def divmod_python(x):
    q, r = divmod(17, 5)
    return x * q + r


def round_python(x):
    return x * round(2.567, 2) + round(3.5)


def round_shape_ratio(x):
    return x * round(x.shape[0] / 4, 1) + round(x.shape[1] / 3)


def pow_builtin(x):
    return pow(x, 2) + pow(2, 3)


def reversed_range(x):
    return [x + i for i in reversed(range(3))]


def list_tuple_constructors(x):
    a = list((x, x + 1))
    b = tuple([x * 2, 3])
    c = dict(a=x, b=2)
    return a, b, c


def set_frozenset(x):
    s = set([1, 2, 2, 3])  # noqa: C405
    f = frozenset(s)
    return x * len(f), 2 in f


def callable_check(x):
    out = x
    if callable(torch.sin):
        out = torch.sin(out)
    if not callable(3):
        out = out + 1
    return out


def type_check(x, n):
    if type(n) is int:
        return x + n
    return x - n


def chr_ord(x):
    return x * (ord("b") - ord("a")), chr(ord("a") + 2)


def min_max_len(xs):
    return xs[min(len(xs) - 1, 5)] * max(len(xs), 1)


def enumerate_dict(d):
    return {k: v * i for i, (k, v) in enumerate(d.items())}


def iter_next(xs):
    it = iter(xs)
    first = next(it)
    second = next(it)
    return first * second, next(it, None) is None


def all_tensors_isinstance(xs):
    if all(isinstance(t, torch.Tensor) for t in xs):
        return torch.stack(xs).sum(0)
    return xs[0]


def hash_int_str(x):
    return x * (hash(3) % 5), hash("const") == hash("const")


def max_min_of_scalar_tensors(x):
    a, b, c = x.sum(), x.mean(), x.amax()
    return max(a, b) * x + min(a, b, c) + max([c, b, a]) - min((b, a))


def max_keeps_the_first_of_equals_and_nan(x):
    nan = x.sum() * float("nan")
    return max(nan, x.sum()) + min(x.sum(), nan) + max(x.sum(), x.sum().clone())


Pair = collections.namedtuple("Pair", ["left", "right"], defaults=[1.5])


class Span(collections.namedtuple("Span", "lo hi")):
    def width(self):
        return self.hi - self.lo


def namedtuple_with_defaults_and_methods(x):
    return Pair(x).right * x + Span(x.min(), x.max()).width()


def tensor_new_with_a_size(x):
    return x.new(2, x.shape[1]).fill_(3.0) + x[:2]


def tuple_concatenation(x):
    shape = (1,) + tuple(x.shape) + (1,)
    return x.reshape(shape).squeeze(-1) * 2


def islice_of_an_iterator(x):
    return sum(itertools.islice(iter([x, x * 2, x * 3, x * 4]), 1, 3))


CASES = [
    Case(
        "namedtuple_with_defaults_and_methods",
        namedtuple_with_defaults_and_methods,
        randn((3, 4)),
    ),
    Case("tensor_new_with_a_size", tensor_new_with_a_size, randn((3, 4))),
    Case("tuple_concatenation", tuple_concatenation, randn((3, 4))),
    Case("islice_of_an_iterator", islice_of_an_iterator, randn((3, 4))),
    Case("max_min_of_scalar_tensors", max_min_of_scalar_tensors, randn((3, 4))),
    Case(
        "max_keeps_the_first_of_equals_and_nan",
        max_keeps_the_first_of_equals_and_nan,
        randn((3, 4)),
    ),
    Case("isinstance_tensor", isinstance_tensor, randn((3,))),
    Case("isinstance_tuple_types", isinstance_tuple_types, lambda: (torch.randn(3), 3)),
    Case("isinstance_list_input", isinstance_list_input, lambda: ([torch.randn(3)] * 2,)),
    Case("len_list_and_tensor", len_list_and_tensor, lambda: ([1, 2, 3], torch.randn(4, 2))),
    Case("range_with_step", range_with_step, randn((3,))),
    Case("range_reversed", range_reversed, randn((3,))),
    Case("range_len_index", range_len_index, randn((3,))),
    Case("enumerate_list", enumerate_list, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("enumerate_start", enumerate_start, lambda: ([torch.randn(3) for _ in range(2)],)),
    Case(
        "zip_two",
        zip_two,
        lambda: ([torch.randn(2) for _ in range(3)], [torch.randn(2) for _ in range(3)]),
    ),
    Case("zip_three_ranges", zip_three_ranges, randn((3,))),
    Case("map_lambda", map_lambda, lambda: ([torch.randn(2) for _ in range(3)],)),
    Case("map_builtin", map_builtin, randn((3,))),
    Case("filter_lambda", filter_lambda, randn((3,))),
    Case("getattr_default", getattr_default, randn((3,))),
    Case("hasattr_check", hasattr_check, randn((3,))),
    Case("setattr_object", setattr_object, lambda: (Box(torch.randn(3)), torch.randn(3))),
    Case("min_max_tensors", min_max_tensors, randn((3,), (3,))),
    Case("min_max_python", min_max_python, randn((3,))),
    Case("max_with_key", max_with_key, randn((3,))),
    Case("sum_list_tensors", sum_list_tensors, lambda: ([torch.randn(3) for _ in range(4)],)),
    Case(
        "sum_with_start",
        sum_with_start,
        lambda: ([torch.randn(3) for _ in range(2)], torch.randn(3)),
    ),
    Case("abs_builtin", abs_builtin, randn((3,))),
    Case("sorted_python", sorted_python, randn((3,))),
    Case("sorted_key", sorted_key, randn((3,))),
    Case("any_all_python", any_all_python, randn((3,))),
    Case("int_float_bool_constants", int_float_bool_constants, randn((3,))),
    Case("divmod_python", divmod_python, randn((3,))),
    Case("round_python", round_python, randn((3,))),
    Case("round_shape_ratio", round_shape_ratio, randn((3, 5))),
    # torch.compile breaks on the builtin pow() of a tensor, before any op, so its count is also
    # 1 (the graph after the break); a capture that handles pow() keeps a single graph.
    Case("pow_builtin", pow_builtin, randn((3,))),
    Case("reversed_range", reversed_range, randn((3,))),
    Case("list_tuple_constructors", list_tuple_constructors, randn((3,))),
    Case("set_frozenset", set_frozenset, randn((3,))),
    Case("callable_check", callable_check, randn((3,))),
    Case("type_check", type_check, lambda: (torch.randn(3), 2)),
    Case("chr_ord", chr_ord, randn((3,))),
    Case("min_max_len", min_max_len, lambda: ([torch.randn(2) for _ in range(3)],)),
    Case(
        "enumerate_dict",
        enumerate_dict,
        lambda: ({"a": torch.randn(2), "b": torch.randn(2), "c": torch.randn(2)},),
    ),
    Case("iter_next", iter_next, lambda: ([torch.randn(2), torch.randn(2)],)),
    Case("all_tensors_isinstance", all_tensors_isinstance, lambda: ([torch.randn(2)] * 3,)),
    Case("hash_int_str", hash_int_str, randn((3,))),
]
