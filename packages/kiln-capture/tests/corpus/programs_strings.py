"""Strings: f-strings and str methods on constants, string keys of dicts."""

import torch
from harness import Case, randn

PREFIX = "layer"


def fstring_key(x):
    out = {}
    for i in range(3):
        out[f"{PREFIX}_{i}"] = x * i
    return out


def fstring_format_spec(x):
    label = f"{3.14159:.2f}|{7:03d}|{'ab':>4}"
    return x * len(label), label


def str_format(x):
    s = "{}-{}".format("a", 2)
    t = "{name}:{value:.1f}".format(name="w", value=1.25)
    return x + len(s), s, t


def percent_format(x):
    s = "%s=%d" % ("n", 4)  # noqa: UP031 - %-formatting is the point
    return x * len(s), s


def join_split(x):
    parts = "a,b,c".split(",")  # noqa: SIM905
    joined = "-".join(parts)
    return x * len(parts), joined


def upper_lower(x):
    name = "Linear"
    return x * 2, name.upper(), name.lower(), name.capitalize(), "ab cd".title()


def startswith_endswith(x):
    name = "encoder.layer.0.weight"
    out = x
    if name.startswith("encoder"):
        out = out + 1
    if name.endswith(".bias"):
        out = out * 100
    return out


def replace_strip(x):
    s = "  model.weight  ".strip().replace("weight", "bias")
    return x * len(s), s


def dict_string_keys(d):
    return d["query"] @ d["key"].T


def string_key_lookup_built(d, x):
    key = "w" + str(1)
    return d[key] * x


def str_of_number(x):
    s = str(42) + str(1.5)
    return x * len(s), s


def string_compare(x, mode):
    if mode == "double":
        return x * 2
    elif mode == "half":
        return x / 2
    return x


def string_in(x):
    s = "attention"
    out = x
    if "tent" in s:
        out = out + 1
    if "z" not in s:
        out = out * 3
    return out


def string_indexing(x):
    s = "abcdef"
    return x * len(s[1:4]), s[0], s[-1], s[::2]


def string_concat_loop(x):
    name = ""
    for i in range(3):
        name += str(i)
    return {name: x}, name


def string_multiply(x):
    return x * len("ab" * 3), "-" * 4


def string_find_count(x):
    s = "banana"
    return x * s.find("n") + s.count("a"), s.index("b")


def string_partition_rsplit(x):
    head, _, tail = "model.layers.3".rpartition(".")
    return x * int(tail), head, "a.b.c".rsplit(".", 1)  # noqa: SIM905


def isdigit_isalpha(x):
    s = "layer3"
    digits = "".join(c for c in s if c.isdigit())
    return x * int(digits), s[:-1].isalpha()


def kwargs_by_string(x, **kw):
    return x * kw["scale"] + kw.get("shift", 0)


def getattr_by_string(x):
    return getattr(torch, "tanh")(x), getattr(x, "sum")()  # noqa: B009


def method_name_dispatch(x):
    out = x
    for name in ["relu", "sigmoid"]:
        out = getattr(out, name)()
    return out


def zfill_ljust(x):
    s = "7".zfill(3) + "a".ljust(3, ".")
    return x * len(s), s


def format_tensor_shape(x):
    desc = "shape=" + "x".join(str(d) for d in x.shape)
    return x.flatten(), desc


def string_dict_comprehension(x):
    names = ["q", "k", "v"]
    return {n.upper(): x * i for i, n in enumerate(names)}


def string_return_only(a, b):
    return f"{a}/{b}".upper()


def splitlines_strip(x):
    lines = "a\n  b \nc".splitlines()
    return x * len(lines), [line.strip() for line in lines]


CASES = [
    Case("fstring_key", fstring_key, randn((3,))),
    Case("fstring_format_spec", fstring_format_spec, randn((3,))),
    Case("str_format", str_format, randn((3,))),
    Case("percent_format", percent_format, randn((3,))),
    Case("join_split", join_split, randn((3,))),
    Case("upper_lower", upper_lower, randn((3,))),
    Case("startswith_endswith", startswith_endswith, randn((3,))),
    Case("replace_strip", replace_strip, randn((3,))),
    Case(
        "dict_string_keys",
        dict_string_keys,
        lambda: ({"query": torch.randn(2, 4), "key": torch.randn(3, 4)},),
    ),
    Case(
        "string_key_lookup_built",
        string_key_lookup_built,
        lambda: ({"w1": torch.randn(3)}, torch.randn(3)),
    ),
    Case("str_of_number", str_of_number, randn((3,))),
    Case("string_compare_double", string_compare, lambda: (torch.randn(3), "double")),
    Case("string_compare_half", string_compare, lambda: (torch.randn(3), "half")),
    Case("string_in", string_in, randn((3,))),
    Case("string_indexing", string_indexing, randn((3,))),
    Case("string_concat_loop", string_concat_loop, randn((3,)), graphs=0),
    Case("string_multiply", string_multiply, randn((3,))),
    Case("string_find_count", string_find_count, randn((3,))),
    Case("string_partition_rsplit", string_partition_rsplit, randn((3,))),
    Case("isdigit_isalpha", isdigit_isalpha, randn((3,))),
    Case(
        "kwargs_by_string",
        kwargs_by_string,
        randn((3,)),
        kwargs=lambda: {"scale": 2.0, "shift": 1},
    ),
    Case("getattr_by_string", getattr_by_string, randn((3,))),
    Case("method_name_dispatch", method_name_dispatch, randn((3,))),
    Case("zfill_ljust", zfill_ljust, randn((3,))),
    Case("format_tensor_shape", format_tensor_shape, randn((3, 4))),
    Case("string_dict_comprehension", string_dict_comprehension, randn((3,))),
    # Pure string work: no graph.
    Case("string_return_only", string_return_only, lambda: ("a", 3), graphs=0),
    Case("splitlines_strip", splitlines_strip, randn((3,))),
]
