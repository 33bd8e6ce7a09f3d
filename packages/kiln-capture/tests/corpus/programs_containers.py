"""Tuples, lists, dicts and sets: building, indexing, unpacking, in-place mutation."""

import torch
from harness import Case, randn


def build_tuple(x):
    return (x, x + 1, (x * 2, 3))


def build_list(x):
    out = [x, x.sin()]
    out.append(x.cos())
    return out


def build_dict(x):
    return {"a": x + 1, "b": x * 2, 3: x - 1}


def index_list(xs):
    return xs[0] + xs[-1] * xs[1]


def slice_list(xs):
    return xs[1:], xs[::-1], xs[:2][0] + 1


def slice_tuple(x, y, z):
    t = (x, y, z)
    a, b = t[:2]
    return a + b, t[1:]


def unpack(pair):
    a, b = pair
    return a * b


def star_unpack(xs):
    first, *rest = xs
    *init, last = xs
    return first + sum(rest), len(init), last


def nested_unpack(data):
    (a, b), c = data
    return a + b * c


def mutate_list_append(xs, x):
    xs.append(x * 2)
    return x + 1


def mutate_list_extend_pop(xs, x):
    xs.extend([x, x + 1])
    last = xs.pop()
    return last * 2


def mutate_list_setitem_del(xs, x):
    xs[0] = x * 3
    del xs[1]
    return xs[0] + xs[-1]


def mutate_list_insert_remove(xs):
    xs.insert(0, 7)
    xs.remove(7)
    xs.insert(1, 5)
    return xs[0] * xs[1]


def mutate_dict_setitem(d, x):
    d["new"] = x * 2
    d["a"] = d["a"] + 1
    return x.sum()


def mutate_dict_update_del(d, x):
    d.update({"c": x - 1, "a": x})
    del d["b"]
    return d["a"] * 2


def mutate_dict_pop_setdefault(d, x):
    v = d.pop("a")
    d.setdefault("z", x)
    d.setdefault("b", x)
    return v + d["b"]


def list_comprehension(x):
    return [x * i for i in range(4)]


def nested_comprehension(x):
    return [[x * i + j for j in range(2)] for i in range(3)]


def comprehension_with_filter(xs):
    return [t * 2 for i, t in enumerate(xs) if i % 2 == 0]


def dict_comprehension(x):
    return {f"k{i}": x + i for i in range(3)}


def set_comprehension(x):
    sizes = {d for d in x.shape}
    return x * len(sizes), sizes


def sorted_keys(d):
    return [d[k] * 2 for k in sorted(d)]


def reversed_list(xs):
    acc = xs[0]
    for t in reversed(xs):
        acc = acc * 0.5 + t
    return acc


def membership(x):
    keys = ["a", "b"]
    nums = (1, 2, 3)
    out = x
    if "a" in keys:
        out = out + 1
    if 4 not in nums:
        out = out * 2
    return out


def dict_membership(d, x):
    if "a" in d and "q" not in d:
        return d["a"] + x
    return x


def dict_iteration(d):
    total = 0
    for k, v in d.items():
        total = total + v * len(k)
    return total


def dict_keys_values(d):
    return list(d.keys()), sum(d.values()), len(d)


def dict_views_are_live(x):
    d = {"a": 1}
    keys, values, items = d.keys(), d.values(), d.items()
    d["b"] = 2  # added after the views were taken: in them, as in Python
    scale = ("b" in keys) + (2 in values) + (("b", 2) in items) + len(keys)
    return x * scale, list(keys), sorted(values), list(items)


def dict_view_escapes(x):
    d = {"a": x.sum()}
    view = d.keys()
    d["b"] = x.mean()
    return x * 2, view


def dict_get_default(d, x):
    return d.get("a", x) + d.get("missing", x * 2)


def set_operations(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    u = s | {9}
    return x * len(s & {2, 3, 8}) + len(u), sorted(s)


def tuple_concat_repeat(x):
    t = (x,) + (x + 1,) * 2
    return t, len(t)


def list_concat_repeat(x):
    lst = [x] * 2 + [x * 3]
    return lst


def list_of_lists_input(grid):
    return grid[1][0] - grid[0][1]


def tensor_list_stack(xs):
    return torch.stack(xs), torch.cat(xs, dim=0)


def list_return_input(xs):
    xs.append(len(xs))
    return xs


def zip_dict(x, y):
    names = ["x", "y"]
    return dict(zip(names, [x, y], strict=True))


def list_index_count(x):
    lst = [3, 1, 4, 1, 5]
    return x * lst.index(4) + lst.count(1)


def list_sort_inplace(x):
    lst = [3, 1, 2]
    lst.sort(reverse=True)
    return x * lst[0], lst


def dict_of_lists(d):
    return d["xs"][0] + d["xs"][1] * d["w"]


def tuple_from_tensor_unpack(x):
    a, b, c = x
    return a + b - c


def tuple_of_shapes(x, y):
    return (x.shape, y.shape), x.reshape(y.shape)


def clear_list(xs, x):
    n = len(xs)
    xs.clear()
    return x * n


def empty_containers(x):
    a, b, c = [], {}, ()
    a.append(x)
    b["x"] = x
    return a, b, c


CASES = [
    Case("build_tuple", build_tuple, randn((3, 4))),
    Case("build_list", build_list, randn((3, 4))),
    Case("build_dict", build_dict, randn((3, 4))),
    Case("index_list", index_list, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("slice_list", slice_list, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("slice_tuple", slice_tuple, randn((3,), (3,), (3,))),
    Case("unpack", unpack, lambda: ((torch.randn(3), torch.randn(3)),)),
    Case("star_unpack", star_unpack, lambda: ([torch.randn(2) for _ in range(4)],)),
    Case("nested_unpack", nested_unpack, lambda: (((torch.randn(2), torch.randn(2)), 3),)),
    Case(
        "mutate_list_append",
        mutate_list_append,
        lambda: ([torch.randn(2)], torch.randn(2)),
    ),
    Case(
        "mutate_list_extend_pop",
        mutate_list_extend_pop,
        lambda: ([torch.randn(2)], torch.randn(2)),
    ),
    Case(
        "mutate_list_setitem_del",
        mutate_list_setitem_del,
        lambda: ([torch.randn(2), torch.randn(2), torch.randn(2)], torch.randn(2)),
    ),
    # Only Python ints: no graph.
    Case("mutate_list_insert_remove", mutate_list_insert_remove, lambda: ([1, 2, 3],), graphs=0),
    Case(
        "mutate_dict_setitem",
        mutate_dict_setitem,
        lambda: ({"a": torch.randn(2)}, torch.randn(2)),
    ),
    Case(
        "mutate_dict_update_del",
        mutate_dict_update_del,
        lambda: ({"a": torch.randn(2), "b": torch.randn(2)}, torch.randn(2)),
    ),
    Case(
        "mutate_dict_pop_setdefault",
        mutate_dict_pop_setdefault,
        lambda: ({"a": torch.randn(2), "b": torch.randn(2)}, torch.randn(2)),
    ),
    Case("list_comprehension", list_comprehension, randn((3, 4))),
    Case("nested_comprehension", nested_comprehension, randn((3,))),
    Case(
        "comprehension_with_filter",
        comprehension_with_filter,
        lambda: ([torch.randn(2) for _ in range(5)],),
    ),
    Case("dict_comprehension", dict_comprehension, randn((3,))),
    Case("set_comprehension", set_comprehension, randn((3, 3))),
    Case("sorted_keys", sorted_keys, lambda: ({"b": torch.randn(2), "a": torch.randn(2)},)),
    Case("reversed_list", reversed_list, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("membership", membership, randn((3,))),
    Case("dict_membership", dict_membership, lambda: ({"a": torch.randn(3)}, torch.randn(3))),
    Case(
        "dict_iteration",
        dict_iteration,
        lambda: ({"a": torch.randn(3), "bb": torch.randn(3)},),
    ),
    Case(
        "dict_keys_values",
        dict_keys_values,
        lambda: ({"a": torch.randn(3), "b": torch.randn(3)},),
    ),
    Case("dict_views_are_live", dict_views_are_live, randn((3, 4))),
    Case("dict_view_escapes", dict_view_escapes, randn((3, 4))),
    Case("dict_get_default", dict_get_default, lambda: ({"a": torch.randn(3)}, torch.randn(3))),
    Case("set_operations", set_operations, randn((3,))),
    Case("tuple_concat_repeat", tuple_concat_repeat, randn((3,))),
    Case("list_concat_repeat", list_concat_repeat, randn((3,))),
    Case(
        "list_of_lists_input",
        list_of_lists_input,
        lambda: ([[torch.randn(2), torch.randn(2)], [torch.randn(2)]],),
    ),
    Case("tensor_list_stack", tensor_list_stack, lambda: ([torch.randn(2, 3) for _ in range(3)],)),
    # Appends a Python int to the input list: no tensor op.
    Case("list_return_input", list_return_input, lambda: ([torch.randn(2)],), graphs=0),
    # Only rearranges the inputs: no tensor op.
    Case("zip_dict", zip_dict, randn((3,), (3,)), graphs=0),
    Case("list_index_count", list_index_count, randn((3,))),
    Case("list_sort_inplace", list_sort_inplace, randn((3,))),
    Case(
        "dict_of_lists", dict_of_lists, lambda: ({"xs": [torch.randn(2), torch.randn(2)], "w": 2},)
    ),
    Case("tuple_from_tensor_unpack", tuple_from_tensor_unpack, randn((3, 4))),
    Case("tuple_of_shapes", tuple_of_shapes, randn((3, 4), (4, 3))),
    Case("clear_list", clear_list, lambda: ([torch.randn(2), torch.randn(2)], torch.randn(2))),
    # Builds containers around the input without computing: no tensor op.
    Case("empty_containers", empty_containers, randn((3,)), graphs=0),
]
