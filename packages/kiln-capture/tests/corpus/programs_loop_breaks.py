"""Graph breaks inside `for` loop bodies: the loop steps natively between resume functions.

The break hands the loop's iterator to a resume function, where capture does not trace it;
there FOR_ITER runs natively and the body or the exit goes on in a resume function of its
own, captured once for every item that reaches it. Each case prints inside the loop (the
break) and leaves it by running out, `break`, `return` or an exception.
"""

import torch
from harness import Case, randn


def helper_with_print(t):
    u = t * 2
    print("in helper")
    return u + 1


def print_then_break(x):
    for i in range(6):
        x = x * 2
        print("step", i)
        if i == 3:
            break
    return x + 1


def for_else(xs):
    total = xs[0] * 0
    for t in xs:
        total = total + t
        print("added")
        if t.dim() > 1:
            break
    else:
        total = total * 2
    return total


def raise_in_loop_inside_try(xs):
    y = xs[0] * 0
    try:
        for t in xs:
            y = y + t
            print("in try")
            if t.dim() > 1:
                raise ValueError("two dims")
        y = y * 3
    except ValueError:
        y = y - 1
    return y


def break_in_loop_inside_try(xs):
    y = xs[0] * 0
    try:
        for t in xs:
            y = y + helper_with_print(t)
            if t.dim() > 1:
                break
        y = y * 3
    except ValueError:
        y = y - 1
    return y


def return_from_loop(xs):
    for t in xs:
        print("checking")
        if t.dim() > 1:
            return t * 2
    return xs[0] + 1


def nested_loops(xs):
    y = xs[0] * 0
    for t in xs:
        for j in range(2):
            y = y + t * j
            print("inner", j)
    return y


def collect_results(xs):
    out = []
    for t in xs:
        out.append(helper_with_print(t) * 2)
    return out


def index_by_position(xs):
    out = xs[0] * 0
    for i in range(len(xs)):
        print("at", i)
        out = out + xs[i] * i
    return out


def many_items(x):
    # more items than capture resumes one by one: the rest of the loop runs natively
    for i in range(200):
        x = x + 1
        print(i)
    return x * 2


def flat():
    return ([torch.randn(3) for _ in range(4)],)


def one_two_dims():
    return ([torch.randn(3), torch.randn(3), torch.randn(1, 3), torch.randn(3)],)


# torch.compile cannot resume inside a loop: it runs each of these frames natively and
# captures only the functions called from it (`oracle_graphs`)
CASES = [
    # before the loop; the body at i=1, at i=2 (from then on i is a graph input), and at i=3,
    # where `i == 3` fails the guard the symbolic i took; the exit
    Case("print_then_break", print_then_break, randn((3,)), graphs=5, oracle_graphs=0),
    # the zeros; the body after the print (once: it serves every item); the else or the exit
    Case("for_else_runs_out", for_else, flat, graphs=3, oracle_graphs=0),
    Case("for_else_breaks", for_else, one_two_dims, graphs=3, oracle_graphs=0),
    Case(
        "raise_in_loop_inside_try_runs_out",
        raise_in_loop_inside_try,
        flat,
        graphs=3,
        oracle_graphs=0,
    ),
    # the handler's part too
    Case(
        "raise_in_loop_inside_try_raises",
        raise_in_loop_inside_try,
        one_two_dims,
        graphs=4,
        oracle_graphs=0,
    ),
    # the zeros; the helper's two parts and the body after its call, once for the 1-D items
    # and again for the 2-D one (a tensor of other dims is captured again), which breaks
    Case(
        "break_in_loop_inside_try",
        break_in_loop_inside_try,
        one_two_dims,
        graphs=7,
        oracle_graphs=4,
    ),
    Case("return_from_loop_body", return_from_loop, one_two_dims, graphs=1),
    Case("return_after_loop", return_from_loop, flat, graphs=1),
    # the inner loop's body at j=0 and j=1 (j a graph input from then on), the zeros
    Case("nested_loops", nested_loops, flat, graphs=3, oracle_graphs=0),
    # the helper's two parts, and the body after the call (once); each result is appended
    Case("collect_results", collect_results, flat, graphs=3, oracle_graphs=2),
    # i reads xs[i]: at i=1 and from i=2 on (i a graph input), before the loop, the body's two
    # places where i crosses a break
    Case(
        "index_by_position",
        index_by_position,
        lambda: ([torch.randn(3) for _ in range(12)],),
        graphs=6,
        oracle_graphs=0,
    ),
    Case("many_items", many_items, randn((3,)), graphs=1, oracle_graphs=0),
]
