"""Hugging Face ``ModelOutput`` objects rebuilt at each call without their constructor.

A ``ModelOutput`` subclass is a dataclass and an ``OrderedDict``: its generated
``__init__`` sets every field through ``ModelOutput.__setattr__`` (which looks up the
dataclass fields at each assignment) and ``__post_init__`` checks the fields and fills the
dict with those that are not None. For an output whose fields are each either None or a
tensor (as capture knows them), what that leaves is fixed: every field in the instance
``__dict__`` in field order, and the tensors in the dict in field order. A
:class:`ModelOutputBuilder` makes exactly that directly, and calls the class as the user's
code does whenever one of those methods is no longer the one it was built for.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

_odict_setitem = OrderedDict.__setitem__
_METHODS = ("__init__", "__post_init__", "__setattr__", "__setitem__", "__new__")


def model_output_base(cls: type) -> type | None:
    """Transformers' ``ModelOutput`` if ``cls`` derives from it, else None."""
    for base in cls.__mro__:
        if base.__name__ == "ModelOutput" and base.__module__.startswith("transformers."):
            return base
    return None


class ModelOutputBuilder:
    """``builder(*tensors)``: an instance of ``cls`` whose fields ``present`` hold the
    tensors (in field order) and whose other fields are None."""

    def __init__(self, cls: type, present: list[str]) -> None:
        self.cls = cls
        self.present = tuple(present)
        self.none_fields = {f.name: None for f in dataclasses.fields(cls)}
        self.init, self.post_init, self.setattr, self.setitem, self.new = (
            getattr(cls, name) for name in _METHODS
        )

    def __call__(self, *tensors):
        cls = self.cls
        if not (
            cls.__init__ is self.init
            and cls.__post_init__ is self.post_init
            and cls.__setattr__ is self.setattr
            and cls.__setitem__ is self.setitem
            and cls.__new__ is self.new
        ):
            return cls(**dict(zip(self.present, tensors, strict=True)))
        out = cls.__new__(cls)
        attributes = out.__dict__
        attributes.update(self.none_fields)
        for name, value in zip(self.present, tensors, strict=True):
            attributes[name] = value
            _odict_setitem(out, name, value)
        return out

    def __repr__(self) -> str:
        return f"<build {self.cls.__qualname__}({', '.join(self.present)})>"


def model_output_builder(cls: type, fields: dict, is_tensor) -> ModelOutputBuilder | None:
    """A builder for an instance of ``cls`` with ``fields`` (name -> variable, each a
    tensor, as ``is_tensor(variable)`` says, or the constant None); None where the
    constructor must run."""
    base = model_output_base(cls)
    if base is None or not dataclasses.is_dataclass(cls) or "__slots__" in vars(cls):
        return None
    if not _generated_init(cls) or any(
        getattr(cls, name) is not getattr(base, name) for name in _METHODS[1:]
    ):
        return None
    declared = dataclasses.fields(cls)
    if any(not f.init for f in declared) or set(fields) - {f.name for f in declared}:
        return None
    present = []
    for f in declared:
        value = fields.get(f.name)
        if value is None:  # not given: its default, which must be None
            if f.default is not None:
                return None
        elif is_tensor(value):
            present.append(f.name)
        elif not (value.is_constant() and value.as_constant() is None):
            return None
    if not present or present[0] != declared[0].name:
        return None  # __post_init__ treats a first field that is not a tensor specially
    return ModelOutputBuilder(cls, present)


def _generated_init(cls: type) -> bool:
    """Whether ``cls.__init__`` is the one the dataclass decorator wrote."""
    init = cls.__init__
    code = getattr(init, "__code__", None)
    return code is not None and code.co_filename == "<string>" and init.__name__ == "__init__"
