"""Calls: helpers, recursion, *args/**kwargs, defaults, keyword-only, methods, lambdas, partial."""

import functools

import torch
from harness import Case, randn


def helper(x, k):
    return x * k + 1


def helper_chain(x):
    return helper(helper(x, 2), 3)


def recursive_sum(xs):
    if not xs:
        return 0
    return xs[0] + recursive_sum(xs[1:])


def recursive_depth(x, n):
    if n == 0:
        return x
    return recursive_depth(x.sin(), n - 1)


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def recursive_python_constant(x):
    return x * fib(7)


def varargs_sum(*ts):
    out = ts[0]
    for t in ts[1:]:
        out = out + t
    return out


def call_varargs(x, y):
    return varargs_sum(x, y, x * 2)


def call_with_star(xs):
    return varargs_sum(*xs)


def kwargs_collect(x, **kw):
    for k in sorted(kw):
        x = x + kw[k]
    return x


def call_kwargs(x):
    return kwargs_collect(x, b=2, a=x)


def call_double_star(x, d):
    return kwargs_collect(x, **d)


def defaults(x, scale=2.0, shift=None):
    y = x * scale
    if shift is not None:
        y = y + shift
    return y


def call_defaults(x):
    return defaults(x), defaults(x, 3.0), defaults(x, shift=1)


def keyword_only(x, *, alpha, beta=0.5):
    return x * alpha + beta


def call_keyword_only(x):
    return keyword_only(x, alpha=3) - keyword_only(x, beta=1, alpha=2)


def positional_only(x, y, /, z=1):
    return x * y + z


def call_positional_only(x, y):
    return positional_only(x, y) + positional_only(x, y, z=2)


def mixed_signature(a, b=1, *args, c, d=4, **kw):
    return a * b + sum(args) + c * d + sum(kw.values())


def call_mixed_signature(x):
    return mixed_signature(x, 2, 3, 4, c=5, e=6, f=7)


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k

    def __call__(self, x):
        return self.apply(x) + 1

    @staticmethod
    def static_add(x, y):
        return x + y

    @classmethod
    def make(cls, k):
        return cls(k)

    @property
    def double(self):
        return self.k * 2


def call_method(x):
    s = Scaler(3)
    return s.apply(x)


def call_dunder_call(x):
    return Scaler(2)(x)


def call_static_class_method(x, y):
    return Scaler.static_add(x, y) * Scaler.make(4).k


def call_property(x):
    return x * Scaler(1.5).double


def call_bound_method_stored(x):
    f = Scaler(5).apply
    return f(x) + f(x)


def call_method_on_input_object(s, x):
    return s.apply(x) + s.double


def lambda_inline(x):
    sq = lambda t: t * t  # noqa: E731
    return sq(x) + sq(x + 1)


def lambda_default_arg(x):
    f = lambda t, k=3: t * k  # noqa: E731
    return f(x), f(x, 4)


def lambda_as_argument(x):
    return apply_fn(lambda t: t.exp(), x)


def apply_fn(fn, x):
    return fn(x)


def call_torch_fn_argument(x):
    return apply_fn(torch.tanh, x)


def partial_helper(x):
    f = functools.partial(helper, k=4)
    return f(x)


def partial_positional(x, y):
    f = functools.partial(torch.add, x)
    return f(y), f(y, alpha=2)


def partial_input(f, x):
    return f(x)


def wraps_decorator(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2

    return wrapper


@wraps_decorator
def decorated(x):
    return x + 1


def call_decorated(x):
    return decorated(x) - 1


def nested_function_def(x):
    def inner(y, z=2):
        return y**z

    return inner(x) + inner(x, 3)


def returns_multiple(x):
    def split(t):
        return t[:1], t[1:]

    a, b = split(x)
    return b.sum(0) - a.sum(0)


def higher_order_compose(x):
    def compose(f, g):
        return lambda t: f(g(t))

    h = compose(torch.relu, lambda t: t - 0.1)
    return h(x)


def map_with_helper(xs):
    return [helper(t, i) for i, t in enumerate(xs)]


def call_builtin_method_reference(x):
    fn = torch.Tensor.add
    return fn(x, 1)


def kwargs_passthrough(x, **kw):
    return defaults(x, **kw)


def star_args_forward(*args, **kwargs):
    return keyword_only(*args, **kwargs)


def lru_cached_constant(x):
    return x * cached_square(4)


@functools.lru_cache(maxsize=8)
def cached_square(n):
    return n * n


class Pipeline:
    def __init__(self, *steps):
        self.steps = steps

    def run(self, t):
        for s in self.steps:
            t = s(t)
        return t


class Builder:
    def __init__(self):
        self.parts = []

    def add(self, t):
        self.parts.append(t)
        return self


class Base:
    def f(self, t):
        return t + 1


class Child(Base):
    def f(self, t):
        return super().f(t) * 2


def class_with_call_chain(x):
    return Pipeline(torch.sin, lambda t: t * 2, Scaler(3)).run(x)


def method_returning_self(x):
    b = Builder().add(x).add(x * 2)
    return torch.stack(b.parts)


def inherited_method(x):
    return Child().f(x)


CASES = [
    Case("helper_chain", helper_chain, randn((3,))),
    Case("recursive_sum", recursive_sum, lambda: ([torch.randn(3) for _ in range(4)],)),
    Case("recursive_depth", recursive_depth, lambda: (torch.randn(3), 3)),
    Case("recursive_python_constant", recursive_python_constant, randn((3,))),
    Case("call_varargs", call_varargs, randn((3,), (3,))),
    Case("call_with_star", call_with_star, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("call_kwargs", call_kwargs, randn((3,))),
    Case("call_double_star", call_double_star, lambda: (torch.randn(3), {"p": 1, "q": 2.5})),
    Case("call_defaults", call_defaults, randn((3,))),
    Case("call_keyword_only", call_keyword_only, randn((3,))),
    Case("call_positional_only", call_positional_only, randn((3,), (3,))),
    Case("call_mixed_signature", call_mixed_signature, randn((3,))),
    Case("call_method", call_method, randn((3,))),
    Case("call_dunder_call", call_dunder_call, randn((3,))),
    Case("call_static_class_method", call_static_class_method, randn((3,), (3,))),
    Case("call_property", call_property, randn((3,))),
    Case("call_bound_method_stored", call_bound_method_stored, randn((3,))),
    Case(
        "call_method_on_input_object",
        call_method_on_input_object,
        lambda: (Scaler(2.5), torch.randn(3)),
    ),
    Case("lambda_inline", lambda_inline, randn((3,))),
    Case("lambda_default_arg", lambda_default_arg, randn((3,))),
    Case("lambda_as_argument", lambda_as_argument, randn((3,))),
    Case("call_torch_fn_argument", call_torch_fn_argument, randn((3,))),
    Case("lambda_is_the_function", lambda x, y: (x - y).abs().sum(), randn((3,), (3,))),
    Case("partial_helper", partial_helper, randn((3,))),
    Case("partial_positional", partial_positional, randn((3,), (3,))),
    Case(
        "partial_input",
        partial_input,
        lambda: (functools.partial(helper, k=1.5), torch.randn(3)),
    ),
    Case("partial_is_the_function", functools.partial(helper, k=-2.0), randn((3,))),
    Case("call_decorated", call_decorated, randn((3,))),
    Case("decorated_is_the_function", decorated, randn((3,))),
    Case("nested_function_def", nested_function_def, randn((3,))),
    Case("returns_multiple", returns_multiple, randn((3, 2))),
    Case("higher_order_compose", higher_order_compose, randn((3,))),
    Case("map_with_helper", map_with_helper, lambda: ([torch.randn(3) for _ in range(3)],)),
    Case("call_builtin_method_reference", call_builtin_method_reference, randn((3,))),
    Case(
        "kwargs_passthrough",
        kwargs_passthrough,
        randn((3,)),
        kwargs=lambda: {"scale": 0.5, "shift": 2},
    ),
    Case(
        "star_args_forward",
        star_args_forward,
        randn((3,)),
        kwargs=lambda: {"alpha": 2.0},
    ),
    Case("lru_cached_constant", lru_cached_constant, randn((3,))),
    Case("class_with_call_chain", class_with_call_chain, randn((3,))),
    Case("method_returning_self", method_returning_self, randn((3,))),
    Case("inherited_method", inherited_method, randn((3,))),
]
