"""Graph breaks: printing and I/O, .item()/.tolist(), unknown C functions, breaks in helpers.

Printed output is compared by the harness. Values that cross a break are chosen so that the
second call sees the same Python values (e.g. an .item() that counts elements), except in the
cases marked recompiles_ok.
"""

import io
import os
import sys
import time
import zlib

import torch
from harness import Case, randn

sink = io.StringIO()
events: list = []


def reset_io():
    sink.seek(0)
    sink.truncate()
    events.clear()


def io_state():
    return sink.getvalue(), list(events)


IO = {"reset": reset_io, "state": io_state}


def print_middle(x):
    y = x + 1
    print("between graphs")
    return y * 2


def print_first(x):
    print("start")
    return x.sin()


def print_last(x):
    y = x * 3
    print("done")
    return y


def print_twice(x):
    y = x + 1
    print("one")
    y = y * 2
    print("two")
    return y - 1


def print_tensor_value(x):
    y = (x > -100).sum()
    print("count:", y)
    return x * y


def print_shape_fstring(x):
    y = x.relu()
    print(f"shape={tuple(y.shape)}")
    return y + 1


def print_no_tensor_ops(x):
    print("only python")
    return x


def stdout_write(x):
    y = x.exp()
    sys.stdout.write("written\n")
    return y.log()


def write_to_buffer(x):
    y = x * 2
    sink.write("logged")
    return y + 1


def item_in_python_arithmetic(x):
    n = (x > -100).sum().item()
    return x * (n + 1)


def item_float_value(x):
    s = x.abs().sum().item()
    return x / s


def item_returned(x):
    return x.pow(2).sum().item()


def float_of_tensor(x):
    m = float((x.abs() >= 0).float().mean())
    return x * m


def int_of_tensor_for_slice(x):
    k = int((x > -100).sum())
    return x[: k - 1] * 2


def item_in_branch(x):
    if (x > -100).sum().item() > 0:
        return x * 2
    return x


def tolist_consumed(x):
    ones = (x > -100).long().tolist()
    return x * sum(ones)


def tolist_returned(x):
    return (x * 2).tolist()


def tolist_float_values(x):
    vals = x.tolist()
    return x + len(vals)


def perf_counter_unused(x):
    y = x * 2
    time.perf_counter()
    return y + 1


def perf_counter_compared(x):
    y = x.cos()
    ok = time.perf_counter() >= 0
    return y * 2 if ok else y


def getpid_call(x):
    y = x + 1
    alive = os.getpid() > 0
    return y * alive


def crc32_constant(x):
    y = x - 1
    k = zlib.crc32(b"kiln") % 7
    return y * k


def bool_of_tensor(x):
    y = x.abs() + 1
    if bool((y > 0).all()):
        return y.log()
    return y


def str_of_tensor(x):
    y = (x > -100).sum()
    label = str(y)
    events.append(label)
    return x * 2


def helper_with_print(t):
    u = t * 2
    print("in helper")
    return u + 1


def break_in_helper(x):
    a = x + 1
    b = helper_with_print(a)
    return b - 1


def helper_with_item(t):
    n = (t > -100).sum().item()
    return t * n


def break_in_helper_item(x):
    a = x.sin()
    return helper_with_item(a).cos()


def inner_most(t):
    print("deep")
    return t * 3


def middle(t):
    return inner_most(t + 1) - 1


def break_two_levels_down(x):
    return middle(x * 2) / 2


def print_in_loop(x):
    for i in range(3):
        x = x * 2
        print("iteration", i)
    return x + 1


def print_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("inside no_grad")
        z = y + 1
    return z, x * 3


def break_keeps_intermediate_alive(x):
    a = x.exp()
    b = a * 2
    print("break")
    return a + b


def break_then_inplace(x):
    y = x.clone()
    print("before mutate")
    y.add_(1)
    return y


def break_with_input_mutation(x):
    x.mul_(2)
    print("mutated")
    x.add_(1)
    return x.sum()


def break_with_list_state(x):
    events.append("a")
    y = x * 2
    print("middle")
    events.append("b")
    return y + 1


def break_helper_returns_none(x):
    log_only(x)
    return x * 2


def log_only(t):
    print("shape", tuple(t.shape))


def multiple_breaks_mixed(x):
    a = x + 1
    n = (a > -100).sum().item()
    b = a * n
    print("n =", n)
    c = b.tanh()
    time.perf_counter()
    return c - 1


def item_then_python_only(x):
    n = (x > -100).sum().item()
    return n * 2


def print_list_of_python_values(x):
    y = x + 1
    print([1, 2, 3], {"k": "v"})
    return y


def break_in_method(x):
    return Logger().run(x)


class Logger:
    def run(self, t):
        t = t * 2
        print("method break")
        return t + 1


def append_result_of_breaking_call(out, x):
    # the list is the caller's: what is appended after the graph goes into it
    out.append(helper_with_print(x))
    return x * 2


class Scaled:
    def __init__(self):
        self.scale = 3.0


def argument_rebound_before_break(obj, x):
    kept = obj
    obj = None
    print("break")
    return x * kept.scale, obj


def break_in_comprehension_helper(xs):
    return [helper_with_print(t) for t in xs]


def break_in_comprehension_between_ops(xs):
    y = xs[0] * 2
    out = [helper_with_print(t) for t in xs]
    return y + out[0] + out[1]


def break_in_dict_comprehension(xs):
    return {i: helper_with_print(t) for i, t in enumerate(xs)}


def break_in_comprehension_shadowing_local(xs):
    t = xs[0] * 3
    scale = 2.0
    out = [helper_with_print(t) * scale for t in xs]
    return t + out[0] + out[1]


def break_in_nested_comprehension(xs):
    y = xs[0].sin()
    out = [[helper_with_print(t) for t in xs] for _ in range(2)]
    return y + out[1][0]


def scale_by_three(t):
    return t * 3


# a function's attribute: capture does not read it, so loading it breaks the graph
helper_with_print.scale = scale_by_three


def break_at_method_load(x):
    y = x + 1
    z = helper_with_print.scale(y)  # LOAD_METHOD (LOAD_ATTR with its flag from 3.12): NULL, attr
    return z.cos()


def break_at_method_load_of_a_method(x):
    y = x + 1
    names = helper_with_print.__dir__()  # found as a method natively: the method and self
    return y * ("scale" in names)


CASES = [
    Case("print_middle", print_middle, randn((3,)), graphs=2),
    Case("print_first", print_first, randn((3,)), graphs=1),
    Case("print_last", print_last, randn((3,)), graphs=1),
    Case("print_twice", print_twice, randn((3,)), graphs=3),
    Case("print_tensor_value", print_tensor_value, randn((3,)), graphs=2),
    Case("print_shape_fstring", print_shape_fstring, randn((3,)), graphs=2),
    Case("print_no_tensor_ops", print_no_tensor_ops, randn((3,)), graphs=0),
    Case("stdout_write", stdout_write, randn((3,)), graphs=2),
    Case("write_to_buffer", write_to_buffer, randn((3,)), graphs=2, **IO),
    Case("item_in_python_arithmetic", item_in_python_arithmetic, randn((3,)), graphs=2),
    # The float from .item() differs between calls, so the resume part is captured again.
    Case("item_float_value", item_float_value, randn((3,)), graphs=2, recompiles_ok=True),
    Case("item_returned", item_returned, randn((3,)), graphs=1),
    Case("float_of_tensor", float_of_tensor, randn((3,)), graphs=2),
    Case("int_of_tensor_for_slice", int_of_tensor_for_slice, randn((4,)), graphs=2),
    Case("item_in_branch", item_in_branch, randn((3,)), graphs=2),
    Case("tolist_consumed", tolist_consumed, randn((3,)), graphs=2),
    Case("tolist_returned", tolist_returned, randn((3,)), graphs=1),
    # The resume part receives the list of floats; only its length is used, but a capture that
    # guards on the values recaptures on the second call.
    Case(
        "tolist_float_values",
        tolist_float_values,
        randn((3,)),
        graphs=1,
        recompiles_ok=True,
    ),
    Case("perf_counter_unused", perf_counter_unused, randn((3,)), graphs=2),
    # The time crosses the break as a float that differs on each call: recaptured.
    Case(
        "perf_counter_compared",
        perf_counter_compared,
        randn((3,)),
        graphs=2,
        recompiles_ok=True,
    ),
    Case("getpid_call", getpid_call, randn((3,)), graphs=2),
    Case("crc32_constant", crc32_constant, randn((3,)), graphs=2),
    Case("bool_of_tensor", bool_of_tensor, randn((3,)), graphs=2),
    Case("str_of_tensor", str_of_tensor, randn((3,)), graphs=2, **IO),
    # The caller breaks at the call; the helper runs captured on its own, breaking at print:
    # caller before, helper before, helper after, caller after.
    Case("break_in_helper", break_in_helper, randn((3,)), graphs=4),
    Case("break_in_helper_item", break_in_helper_item, randn((3,)), graphs=4),
    Case("break_two_levels_down", break_two_levels_down, randn((3,)), graphs=5),
    # A break inside a for loop: Kiln compiles the ops before the loop, then the loop steps
    # natively between resume functions: the body at i=1, again at i=2 (the int item changed,
    # so it is a graph input from then on), and the exit. torch.compile cannot resume
    # mid-iteration and runs the whole frame natively (0 graphs).
    Case("print_in_loop", print_in_loop, randn((3,)), graphs=4, oracle_graphs=0),
    # The load runs natively, the call and the rest in the resume function (2 graphs);
    # torch.compile reads a function's attributes (1 graph).
    Case("break_at_method_load", break_at_method_load, randn((3,)), graphs=2, oracle_graphs=1),
    Case(
        "break_at_method_load_of_a_method", break_at_method_load_of_a_method, randn((3,)), graphs=2
    ),
    Case("print_in_no_grad", print_in_no_grad, randn((3,), requires_grad=True), graphs=2),
    Case("break_keeps_intermediate_alive", break_keeps_intermediate_alive, randn((3,)), graphs=2),
    Case("break_then_inplace", break_then_inplace, randn((3,)), graphs=2),
    Case("break_with_input_mutation", break_with_input_mutation, randn((3,)), graphs=2),
    Case("break_with_list_state", break_with_list_state, randn((3,)), graphs=2, **IO),
    Case("break_helper_returns_none", break_helper_returns_none, randn((3,)), graphs=1),
    Case("multiple_breaks_mixed", multiple_breaks_mixed, randn((3,)), graphs=4),
    Case("item_then_python_only", item_then_python_only, randn((3,)), graphs=1),
    Case("print_list_of_python_values", print_list_of_python_values, randn((3,)), graphs=1),
    Case("break_in_method", break_in_method, randn((3,)), graphs=2),
    # the helper's two parts, then x * 2; the caller's list gets the helper's result
    Case(
        "append_result_of_breaking_call",
        append_result_of_breaking_call,
        lambda: ([torch.randn(2)], torch.randn(3)),
        graphs=3,
        oracle_recompiles="torch.compile's resume function holds the first call's list.append "
        "by identity, a cache line dropped when that list is freed",
    ),
    Case(
        "argument_rebound_before_break",
        argument_rebound_before_break,
        lambda: (Scaled(), torch.randn(3)),
        graphs=1,
    ),
    # before the comprehension, the helper's two parts (the comprehension's first item; the
    # loop steps natively to the next, which reuses them), after the comprehension. From 3.12
    # the comprehension is inlined (PEP 709): the break moves to its start, where it is cut
    # out as a function and called natively, captured on its own as before 3.12
    Case(
        "break_in_comprehension_between_ops",
        break_in_comprehension_between_ops,
        lambda: ([torch.randn(3) for _ in range(2)],),
        graphs=4,
    ),
    # the helper's two parts; the comprehension's second item resumes after its first (its
    # key, an int from enumerate, changed: from then on it is an input of a graph that only
    # hands it back for the dict). torch.compile runs the comprehension's rest natively, as
    # Kiln does from 3.12, where the comprehension is cut out of the frame at its start
    Case(
        "break_in_dict_comprehension",
        break_in_dict_comprehension,
        lambda: ([torch.randn(3) for _ in range(2)],),
        graphs=3 if sys.version_info < (3, 12) else 2,
        oracle_graphs=2,
    ),
    Case(
        "break_in_comprehension_helper",
        break_in_comprehension_helper,
        lambda: ([torch.randn(3) for _ in range(2)],),
        graphs=2,
    ),
    # the comprehension's variable is bound before it and read after it (3.12 saves and
    # restores it around the inlined loop); the comprehension reads another local, which
    # before 3.12 makes it a cell of the frame: there the comprehension is a closure over
    # the frame's cell, called natively at the break (not captured on its own), and the
    # frame's two parts are captured around it
    Case(
        "break_in_comprehension_shadowing_local",
        break_in_comprehension_shadowing_local,
        lambda: ([torch.randn(3) for _ in range(2)],),
        graphs=4 if sys.version_info >= (3, 12) else 2,
        oracle_graphs=4,
    ),
    Case(
        "break_in_nested_comprehension",
        break_in_nested_comprehension,
        lambda: ([torch.randn(3) for _ in range(2)],),
        graphs=4 if sys.version_info >= (3, 12) else 2,
        oracle_graphs=4,
    ),
]
