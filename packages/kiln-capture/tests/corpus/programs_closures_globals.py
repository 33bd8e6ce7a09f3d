"""Closures, nonlocal writes, reading and writing module globals."""

import torch
from harness import Case, randn

SCALE = 2.5
OFFSET = torch.tensor([1.0, 2.0, 3.0])
TABLE = {"w": 3, "b": -1}
NAMES = ["a", "b", "c"]
SCALE_BY_TYPE = {int: 2, float: 0.5, torch.Tensor: 3}  # keys a guard cannot print as literals
counter = 0
history: list = []
registry: dict = {}
flag = True
last = None


def reset_globals():
    global counter, flag, last
    counter = 0
    flag = True
    last = None
    history.clear()
    registry.clear()


def snapshot():
    return {
        "counter": counter,
        "flag": flag,
        "last": last,
        "history": list(history),
        "registry": dict(registry),
    }


def make_scaler(k):
    def scale(x):
        return x * k

    return scale


def make_adder(t):
    def add(x):
        return x + t

    return add


def make_counter():
    count = 0

    def step(x):
        nonlocal count
        count += 1
        return x * count

    return step


def make_accumulator():
    total = []

    def acc(x):
        total.append(x.sum())
        return len(total), x + 1

    return acc


def make_nested(a):
    def outer(x):
        b = a * 2

        def inner(y):
            return y * a + b

        return inner(x) + inner(x + 1)

    return outer


def read_global_float(x):
    return x * SCALE


def read_global_tensor(x):
    return x + OFFSET


def read_global_dict(x):
    return x * TABLE["w"] + TABLE["b"]


def read_global_list(x):
    return {name: x + i for i, name in enumerate(NAMES)}


def write_global_counter(x):
    global counter
    counter += 1
    return x * counter


def write_global_twice(x):
    global counter
    counter += 1
    y = x + counter
    counter += 10
    return y * counter


def append_global_list(x):
    history.append("called")
    history.append(x.shape[0])
    return x * 2


def append_tensor_to_global_list(x):
    y = x.cos()
    history.append(y)
    return y + 1


def write_global_dict(x):
    registry["out"] = x * 2
    registry["n"] = 1
    return x - 1


def write_global_flag(x):
    global flag
    flag = not flag
    return x if flag else -x


def write_global_tensor(x):
    global last
    last = x * 3
    return last + 1


def read_then_write_global(x):
    global counter
    before = counter
    counter = before + 5
    return x * before + counter


def closure_over_tensor_factory():
    w = torch.tensor([0.5, -1.0, 2.0])

    def fn(x):
        return x * w

    return fn


def closure_mutation_cell():
    state = {"calls": 0}

    def fn(x):
        state["calls"] += 1
        return x + state["calls"]

    return fn, state


def lambda_closure_factory(k):
    return lambda x: x * k + k


def global_function_call(x):
    return helper_global(x) * 2


def helper_global(x):
    return x.relu()


def closure_reads_global_after_rebind(x):
    f = make_adder(SCALE)
    return f(x)


def global_counter_in_loop(x):
    global counter
    for _ in range(3):
        counter += 1
        x = x + counter
    return x


def nonlocal_in_nested(x):
    total = 0

    def bump(v):
        nonlocal total
        total += v

    bump(1)
    bump(2)
    return x * total


def nonlocal_tensor(x):
    acc = x

    def add(v):
        nonlocal acc
        acc = acc + v

    add(x)
    add(1)
    return acc


def closure_in_comprehension(x):
    fns = [make_scaler(i) for i in range(1, 4)]
    return [f(x) for f in fns]


def global_dict_counter(x):
    registry["hits"] = registry.get("hits", 0) + 1
    return x + registry["hits"]


def default_captured_late(x):
    fs = [lambda y, i=i: y + i for i in range(3)]
    return [f(x) for f in fs]


def late_binding_closure(x):
    fs = [lambda y: y + i for i in range(3)]  # noqa: B023 - late binding is the point
    return [f(x) for f in fs]


COUNTER_CLOSURE = make_counter()
ACC_CLOSURE = make_accumulator()
CELL_FN, CELL_STATE = closure_mutation_cell()


def reset_cell():
    CELL_STATE["calls"] = 0


def reset_counter_closure():
    COUNTER_CLOSURE.__closure__[0].cell_contents = 0


def counter_closure_state():
    return COUNTER_CLOSURE.__closure__[0].cell_contents


def reset_acc():
    ACC_CLOSURE.__closure__[0].cell_contents.clear()


def acc_state():
    return list(ACC_CLOSURE.__closure__[0].cell_contents)


G = {"reset": reset_globals, "state": snapshot}


def global_dict_keyed_by_class(x):
    return x * SCALE_BY_TYPE[float] + SCALE_BY_TYPE[type(x)]


CASES = [
    Case("closure_scale", make_scaler(3.0), randn((3, 4))),
    Case("closure_tensor", make_adder(torch.tensor([1.0, 2.0, 3.0, 4.0])), randn((3, 4))),
    Case(
        "closure_nonlocal_counter",
        COUNTER_CLOSURE,
        randn((3,)),
        reset=reset_counter_closure,
        state=counter_closure_state,
    ),
    Case("closure_list_append", ACC_CLOSURE, randn((3,)), reset=reset_acc, state=acc_state),
    Case("closure_nested", make_nested(1.5), randn((3,))),
    Case("read_global_float", read_global_float, randn((3,))),
    Case("read_global_tensor", read_global_tensor, randn((2, 3))),
    Case("read_global_dict", read_global_dict, randn((3,))),
    Case("read_global_list", read_global_list, randn((3,))),
    Case("write_global_counter", write_global_counter, randn((3,)), **G),
    Case("write_global_twice", write_global_twice, randn((3,)), **G),
    Case("append_global_list", append_global_list, randn((3,)), **G),
    Case("append_tensor_to_global_list", append_tensor_to_global_list, randn((3,)), **G),
    Case("write_global_dict", write_global_dict, randn((3,)), **G),
    Case("write_global_flag", write_global_flag, randn((3,)), **G),
    Case("write_global_tensor", write_global_tensor, randn((3,)), **G),
    Case("read_then_write_global", read_then_write_global, randn((3,)), **G),
    Case("closure_over_tensor", closure_over_tensor_factory(), randn((3,))),
    Case(
        "closure_mutates_dict_cell",
        CELL_FN,
        randn((3,)),
        reset=reset_cell,
        state=lambda: dict(CELL_STATE),
    ),
    Case("lambda_closure", lambda_closure_factory(4), randn((3,))),
    Case("global_function_call", global_function_call, randn((3,))),
    Case("closure_reads_global", closure_reads_global_after_rebind, randn((3,))),
    Case("global_counter_in_loop", global_counter_in_loop, randn((3,)), **G),
    Case("nonlocal_in_nested", nonlocal_in_nested, randn((3,))),
    Case("nonlocal_tensor", nonlocal_tensor, randn((3,))),
    Case("closure_in_comprehension", closure_in_comprehension, randn((3,))),
    Case("global_dict_counter", global_dict_counter, randn((3,)), **G),
    Case("default_captured_late", default_captured_late, randn((3,))),
    Case("late_binding_closure", late_binding_closure, randn((3,))),
    Case("global_dict_keyed_by_class", global_dict_keyed_by_class, randn((3,))),
]
