"""Python values that are immutable and known at capture time: numbers, strings, None,
dtypes, devices, types of the standard library, ..."""

from __future__ import annotations

import types

import torch

from kiln_capture.variables.base import Variable

CONSTANT_TYPES = (
    int,
    float,
    bool,
    complex,
    str,
    bytes,
    type(None),
    type(Ellipsis),
    type(NotImplemented),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    range,
    slice,
    types.CodeType,
)


def is_constant_value(value) -> bool:
    if type(value) in (tuple, frozenset):
        return all(is_constant_value(v) for v in value)
    return type(value) in CONSTANT_TYPES


class ConstantVariable(Variable):
    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self):
        return self.value

    def describe(self) -> str:
        return repr(self.value)

    def truthy(self, tx) -> bool:
        return bool(self.value)

    def getattr(self, tx, name: str):
        from kiln_capture.variables.base import MethodVariable
        from kiln_capture.variables.builder import wrap_derived

        attr = tx.run_user_code(getattr, self.value, name)
        if callable(attr) and not isinstance(attr, type):
            return MethodVariable(self, name)
        return wrap_derived(tx, attr)

    def call_method(self, tx, name, args, kwargs):
        from kiln_capture.variables.builder import wrap_derived

        if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()):
            method = getattr(self.value, name)
            result = tx.run_user_code(
                method,
                *[a.as_constant() for a in args],
                **{k: v.as_constant() for k, v in kwargs.items()},
            )
            return wrap_derived(tx, result)
        return super().call_method(tx, name, args, kwargs)

    def unpack(self, tx):
        if isinstance(self.value, (str, bytes, range, tuple, frozenset)):
            return [ConstantVariable(v) for v in self.value]
        return super().unpack(tx)

    def reconstruct(self, cg) -> None:
        cg.load_const(self.value)
