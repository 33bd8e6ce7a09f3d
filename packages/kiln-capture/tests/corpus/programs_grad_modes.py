"""Grad modes and autocast as context managers and decorators; results' requires_grad."""

import torch
from harness import Case, randn
from torch import nn

BF16 = {"atol": 1e-2, "rtol": 1e-2}

torch.manual_seed(4321)
LIN = nn.Linear(4, 4)


def grad_args(*shapes):
    return randn(*shapes, requires_grad=True)


def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y, x * 3


def no_grad_then_grad(x):
    with torch.no_grad():
        y = x.sin()
    return y * x


@torch.no_grad()
def no_grad_decorator(x):
    return x.exp() + 1


def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
    return a, b


def set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x + 1
    return y


def set_grad_enabled_true(x):
    with torch.set_grad_enabled(True):
        y = x + 1
    return y


def set_grad_enabled_constant(x, train):
    with torch.set_grad_enabled(train):
        return x * 2


def is_grad_enabled_branch(x):
    if torch.is_grad_enabled():
        return x * 2
    return x


def is_grad_enabled_inside_no_grad(x):
    with torch.no_grad():
        flag = torch.is_grad_enabled()
        y = x * 2
    return y, flag


def inference_mode_like_detach(x):
    y = (x * 2).detach()
    return y, y.requires_grad


def requires_grad_attr(x, y):
    return x * y, x.requires_grad, y.requires_grad


def module_under_no_grad(x):
    with torch.no_grad():
        return LIN(x)


def module_with_grad(x):
    return LIN(x).sum(-1)


def autocast_matmul(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = a @ b
    return c, c.dtype


def autocast_linear(x):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        y = LIN(x)
    return y.float() + 1


@torch.autocast("cpu", dtype=torch.bfloat16)
def autocast_decorator(a, b):
    return torch.mm(a, b)


def autocast_disabled_inner(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = a @ b
        with torch.autocast("cpu", enabled=False):
            d = a @ b
    return c, d


def autocast_elementwise_stays_float(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x * 2 + 1
    return y


def autocast_with_no_grad(a, b):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        c = a @ b
    return c


def no_grad_nested_function(x):
    def inner(t):
        with torch.no_grad():
            return t * 4

    return inner(x) + x


def detach_and_requires_grad(x):
    y = x.detach().requires_grad_(False)
    return y * 2, x * 2


def backward_inside(x):
    y = (x * x).sum()
    y.backward()
    return y.detach()


def torch_grad_functional(x):
    y = (x.sin()).sum()
    (g,) = torch.autograd.grad(y, x)
    return g


def no_grad_inplace_on_leaf(w, g):
    with torch.no_grad():
        w -= 0.1 * g
    return w


@torch.enable_grad()
def enable_grad_decorator(x):
    return x * 5


def grad_mode_restored_after_block(x):
    with torch.no_grad():
        pass
    return x * 2, torch.is_grad_enabled()


CASES = [
    Case("no_grad_block", no_grad_block, grad_args((3,))),
    Case("no_grad_then_grad", no_grad_then_grad, grad_args((3,))),
    Case("no_grad_decorator", no_grad_decorator, grad_args((3,))),
    Case("enable_grad_inside_no_grad", enable_grad_inside_no_grad, grad_args((3,))),
    Case("set_grad_enabled_false", set_grad_enabled_false, grad_args((3,))),
    Case("set_grad_enabled_true", set_grad_enabled_true, grad_args((3,))),
    Case(
        "set_grad_enabled_arg_false",
        set_grad_enabled_constant,
        lambda: (torch.randn(3, requires_grad=True), False),
    ),
    Case(
        "set_grad_enabled_arg_true",
        set_grad_enabled_constant,
        lambda: (torch.randn(3, requires_grad=True), True),
    ),
    Case("is_grad_enabled_branch", is_grad_enabled_branch, grad_args((3,))),
    Case("is_grad_enabled_inside_no_grad", is_grad_enabled_inside_no_grad, grad_args((3,))),
    Case("detach_requires_grad", inference_mode_like_detach, grad_args((3,))),
    Case(
        "requires_grad_attr",
        requires_grad_attr,
        lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
    ),
    Case("module_under_no_grad", module_under_no_grad, randn((2, 4))),
    Case("module_with_grad", module_with_grad, randn((2, 4))),
    Case("autocast_matmul", autocast_matmul, randn((3, 4), (4, 5)), tol=BF16),
    Case("autocast_linear", autocast_linear, randn((2, 4)), tol=BF16),
    Case("autocast_decorator", autocast_decorator, randn((3, 4), (4, 5)), tol=BF16),
    Case("autocast_disabled_inner", autocast_disabled_inner, randn((3, 4), (4, 5)), tol=BF16),
    Case("autocast_elementwise", autocast_elementwise_stays_float, randn((3,))),
    Case("autocast_with_no_grad", autocast_with_no_grad, grad_args((3, 4), (4, 5)), tol=BF16),
    Case("no_grad_nested_function", no_grad_nested_function, grad_args((3,))),
    Case("detach_and_requires_grad", detach_and_requires_grad, grad_args((3,))),
    # .backward() is not recorded into a forward graph: the graph breaks before it, backward runs
    # natively (filling x.grad), and the resume graph holds the detach.
    Case("backward_inside", backward_inside, grad_args((3,)), graphs=2),
    # torch.autograd.grad is not recorded into a forward graph: the graph breaks before it, and
    # the part after it has no op.
    Case("autograd_grad_inside", torch_grad_functional, grad_args((3,))),
    Case(
        "no_grad_inplace_on_leaf",
        no_grad_inplace_on_leaf,
        lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
    ),
    Case("enable_grad_decorator", enable_grad_decorator, grad_args((3,))),
    Case("grad_mode_restored_after_block", grad_mode_restored_after_block, grad_args((3,))),
]
