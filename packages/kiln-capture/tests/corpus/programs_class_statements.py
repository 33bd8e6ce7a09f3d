"""``class`` statements inside the captured function. A class whose body only defines
things (methods, constants, annotations, properties) is made once at capture time and
traced like any class; other class statements break the graph and run natively."""

import torch
from harness import Case, randn

NEW_CLASS = {"oracle_recompiles": "torch.compile guards on the class made by each call"}


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
]
