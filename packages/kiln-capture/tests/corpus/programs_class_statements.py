"""``class`` statements inside the captured function. A class whose body only defines
things (methods, constants, annotations, properties) is made once at capture time and
traced like any class, also where its methods read (or write) variables of the enclosing
function; other class statements break the graph and run natively."""

import torch
from harness import Case, randn

NEW_CLASS = {"oracle_recompiles": "torch.compile guards on the class made by each call"}
# torch.compile breaks the graph at a class statement (a graph before it, one after)
CLOSURE_CLASS = {**NEW_CLASS, "oracle_graphs": 2}


def class_with_methods(x):
    class Scaler:
        def __init__(self, k):
            self.k = k

        def apply(self, t):
            return t * self.k + 1

    return Scaler(3.0).apply(x)


def class_with_property_and_annotation(x):
    class Pair:
        scale: float = 2.0

        def __init__(self, a, b):
            self.a, self.b = a, b

        @property
        def total(self):
            return (self.a + self.b) * self.scale

        @staticmethod
        def double(t):
            return t * 2

    p = Pair(x.sin(), x.cos())
    return Pair.double(p.total)


def class_instance_escapes(x):
    class Box:
        def __init__(self, v):
            self.v = v

    box = Box(x.exp())
    return box.v + 1, type(box).__name__


def class_with_super(x):
    class Base:
        def f(self, t):
            return t + 1

    class Child(Base):
        def f(self, t):
            return super().f(t) * 2

    return Child().f(x)


def module_class_in_frame(x):
    class Shift(torch.nn.Module):
        def forward(self, t):
            return t.relu() + 1

    return Shift()(x * 2)


def class_with_mutable_attribute(x):
    y = x + 1

    class Registry:
        items = []

    Registry.items.append(1)
    return y * len(Registry.items)


def closure_method(x):
    k = 3.0
    y = x.sin()

    class Scaler:
        def apply(self, t):
            return t * k

    return Scaler().apply(y)


def closure_class_over_tensor(x):
    w = x.cos()

    class Mul:
        def __call__(self, t):
            return t * w

    return Mul()(x.sin())


def closure_late_binding(x):
    k = 1.0
    y = x.exp()

    class Reader:
        def read(self, t):
            return t * k

    k = 2.0
    return Reader().read(y)


def closure_nonlocal_write(x):
    count = 0
    acc = x.sin()

    class Counter:
        def bump(self, t):
            nonlocal count, acc
            count += 1
            acc = acc + t

    counter = Counter()
    counter.bump(x)
    counter.bump(x * 2)
    return acc * count


def closure_read_by_body(x):
    n = 4
    y = x.sin()

    class Config:
        size = n

        def twice(self, k=n):
            return self.size * k

    return y * Config().twice()


def closure_decorators(x):
    s = 0.5
    y = x.tanh()

    class Scaled:
        def __init__(self, v):
            self.v = v

        @property
        def scaled(self):
            return self.v * s

        @staticmethod
        def shift(t):
            return t + s

        @classmethod
        def make(cls, v):
            return cls(v * s)

    return Scaled.shift(Scaled.make(y).scaled)


def closure_subclass_and_super(x):
    k = 2.0
    y = x.sin()

    class Base:
        def f(self, t):
            return t + k

    class Child(Base):
        def f(self, t):
            return super().f(t) * k

    return Child().f(y)


def _helper_with_class(t, scale):
    class Holder:
        def go(self):
            return t * scale

    return Holder().go()


def closure_class_in_helper(x):
    return _helper_with_class(x.sin(), 3.0) + 1


def closure_of_captured_function_factory(scale):
    def fn(x):
        y = x.sin()

        class Scaler:
            def go(self, t):
                return t * scale

        return Scaler().go(y)

    return fn


ESCAPED: list = []


def closure_class_escapes(x):
    k = x.sin()

    class Holder:
        def value(self):
            return k * 2

    ESCAPED.append(Holder)
    return Holder().value()


CASES = [
    Case("class_with_methods", class_with_methods, randn((3,)), **NEW_CLASS),
    Case(
        "class_with_property_and_annotation",
        class_with_property_and_annotation,
        randn((3,)),
        **NEW_CLASS,
    ),
    Case("class_instance_escapes", class_instance_escapes, randn((3,)), **NEW_CLASS),
    Case("class_with_super", class_with_super, randn((3,)), **NEW_CLASS),
    # constructing an nn.Module subclass breaks the graph (natively, it has nothing before
    # it); its call is captured in the resume function
    Case("module_class_in_frame", module_class_in_frame, randn((3,)), **NEW_CLASS),
    # a body that makes a mutable value runs natively, each call a new class: the rest of
    # the frame is captured again for each (up to the recompile limit)
    Case(
        "class_with_mutable_attribute",
        class_with_mutable_attribute,
        randn((3,)),
        graphs=2,
        recompiles_ok=True,
    ),
    Case("closure_method", closure_method, randn((3,)), **CLOSURE_CLASS),
    Case("closure_class_over_tensor", closure_class_over_tensor, randn((3,)), **CLOSURE_CLASS),
    Case("closure_late_binding", closure_late_binding, randn((3,)), **CLOSURE_CLASS),
    Case("closure_nonlocal_write", closure_nonlocal_write, randn((3,)), **CLOSURE_CLASS),
    Case("closure_read_by_body", closure_read_by_body, randn((3,)), **CLOSURE_CLASS),
    Case("closure_decorators", closure_decorators, randn((3,)), **CLOSURE_CLASS),
    Case(
        "closure_subclass_and_super",
        closure_subclass_and_super,
        randn((3,)),
        **CLOSURE_CLASS,
    ),
    # torch.compile: the caller's graph before the helper's class statement and after it,
    # and the helper's rest
    Case(
        "closure_class_in_helper",
        closure_class_in_helper,
        randn((3,)),
        **{**CLOSURE_CLASS, "oracle_graphs": 3},
    ),
    Case(
        "closure_of_captured_function",
        closure_of_captured_function_factory(5.0),
        randn((3,)),
        **CLOSURE_CLASS,
    ),
    # a class over the frame's variables that leaves the frame needs its own cells in each
    # call: the frame runs eagerly (0 graphs)
    Case(
        "closure_class_escapes",
        closure_class_escapes,
        randn((3,)),
        graphs=0,
        **CLOSURE_CLASS,
        reset=ESCAPED.clear,
        state=lambda: [cls.__qualname__ for cls in ESCAPED],
    ),
]
