"""Where a value came from, so that guards can check it and generated code can reload it.

Every source prints as a Python expression over the captured frame's arguments
(``expr``), which guard functions use, and emits the bytecode that loads it inside the
transformed frame (``emit``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar


class Source:
    def expr(self) -> str:
        """The source as a Python expression, rendered once (a source never changes)."""
        rendered = self.__dict__.get("_expr")
        if rendered is None:
            rendered = self.render()
            object.__setattr__(self, "_expr", rendered)  # a cache, not a field
        return rendered

    def render(self) -> str:
        raise NotImplementedError

    def over(self, base: str) -> str:
        """This source's expression with ``base`` standing for its base's."""
        return base + self.expr()[len(self.base.expr()) :]

    def emit(self, cg) -> None:
        raise NotImplementedError

    def root(self) -> Source:
        return self


@dataclass(frozen=True)
class LocalSource(Source):
    """An argument of the captured frame (or a local bound before a resume point)."""

    name: str

    def render(self) -> str:
        return self.name

    def emit(self, cg) -> None:
        cg.load_local(self.name)


@dataclass(frozen=True)
class GlobalSource(Source):
    name: str

    def render(self) -> str:
        return f"___G[{self.name!r}]"

    def emit(self, cg) -> None:
        cg.load_global(self.name)


@dataclass(frozen=True)
class ClosureSource(Source):
    """The contents of a free variable of the captured function."""

    name: str
    index: int

    def render(self) -> str:
        return f"___closure[{self.index}].cell_contents"

    def emit(self, cg) -> None:
        cg.load_deref(self.name)


@dataclass(frozen=True)
class PassedCellSource(Source):
    """The contents of a cell that a resume function takes as an argument."""

    name: str

    def render(self) -> str:
        return f"{self.name}.cell_contents"

    def emit(self, cg) -> None:
        cg.load_deref(self.name)


@dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    attr: str

    def render(self) -> str:
        return f"{self.base.expr()}.{self.attr}"

    def emit(self, cg) -> None:
        self.base.emit(cg)
        cg.load_attr(self.attr)

    def root(self) -> Source:
        return self.base.root()


@dataclass(frozen=True)
class GenericAttrSource(Source):
    """``object.__getattribute__(base, attr)``: an attribute read past the class's own
    ``__getattribute__`` (what ``super().__getattribute__(attr)`` reads inside it)."""

    base: Source
    attr: str

    def render(self) -> str:
        return self.over(self.base.expr())

    def over(self, base: str) -> str:
        return f"___object_getattribute({base}, {self.attr!r})"

    def emit(self, cg) -> None:
        cg.call(
            lambda: cg.load_const(object.__getattribute__),
            [lambda: self.base.emit(cg), lambda: cg.load_const(self.attr)],
        )

    def root(self) -> Source:
        return self.base.root()


def is_literal_key(key) -> bool:
    """Whether ``repr(key)`` reads back as ``key`` in a guard (a number, a string, ...)."""
    if type(key) is tuple:
        return all(is_literal_key(item) for item in key)
    if type(key) is float:
        return math.isfinite(key)
    return key is None or type(key) in (int, str, bytes, bool)


def key_name(key) -> str:
    """The guard's name for a dict key that does not print as a literal (a class, as the
    keys of torch's table of type names): built from the key's module and qualified name
    where it has them."""
    label = getattr(key, "__qualname__", None)
    if isinstance(label, str):
        label = f"{getattr(key, '__module__', None) or ''}_{label}"
    else:
        label = f"{type(key).__name__}_{id(key):x}"
    return "___key_" + re.sub(r"\W", "_", label)


@dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: object

    def render(self) -> str:
        key = repr(self.key) if is_literal_key(self.key) else key_name(self.key)
        return f"{self.base.expr()}[{key}]"

    def emit(self, cg) -> None:
        self.base.emit(cg)
        cg.load_const(self.key)
        cg.subscr()

    def root(self) -> Source:
        return self.base.root()


@dataclass(frozen=True)
class DictAttrSource(Source):
    """``base.__dict__[key]``: an instance attribute read past ``__getattr__``."""

    base: Source
    key: str

    def render(self) -> str:
        return f"{self.base.expr()}.__dict__[{self.key!r}]"

    def emit(self, cg) -> None:
        self.base.emit(cg)
        cg.load_attr("__dict__")
        cg.load_const(self.key)
        cg.subscr()

    def root(self) -> Source:
        return self.base.root()


@dataclass(frozen=True)
class ModuleMemberSource(Source):
    """A parameter, buffer or submodule of an nn.Module, read from its registry dict."""

    base: Source
    registry: str  # "_parameters", "_buffers" or "_modules"
    key: str

    def render(self) -> str:
        return f"{self.base.expr()}.{self.registry}[{self.key!r}]"

    def emit(self, cg) -> None:
        self.base.emit(cg)
        cg.load_attr(self.registry)
        cg.load_const(self.key)
        cg.subscr()

    def root(self) -> Source:
        return self.base.root()


@dataclass(frozen=True, eq=False)
class ObjectSource(Source):
    """An object held by reference (a module's globals dict, the builtins dict), named by
    ``label`` in guards: ``builtins`` or ``globals_<module>``."""

    obj: object
    label: str

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, ObjectSource) and other.obj is self.obj

    def render(self) -> str:
        return f"___{self.label}"

    def emit(self, cg) -> None:
        cg.load_const(self.obj)


def ndarray_tensor(array):
    """A tensor over a ``numpy.ndarray``'s memory, or None where torch cannot view it (a
    dtype torch lacks, negative strides, another byte order)."""
    import torch

    try:
        return torch.from_numpy(array)
    except (TypeError, ValueError, RuntimeError):
        return None


@dataclass(frozen=True)
class HelperSource(Source):
    """``helper(base)``: a value computed from ``base`` by one of kiln-capture's helpers,
    which guard functions name ``___<helper's name>``."""

    base: Source
    helper: ClassVar[staticmethod]

    def render(self) -> str:
        return self.over(self.base.expr())

    def over(self, base: str) -> str:
        return f"___{self.helper.__name__}({base})"

    def emit(self, cg) -> None:
        cg.call(lambda: cg.load_const(self.helper), [lambda: self.base.emit(cg)])

    def root(self) -> Source:
        return self.base.root()


@dataclass(frozen=True)
class NdarrayTensorSource(HelperSource):
    """The tensor over an ndarray the frame reads (``torch.from_numpy``): the graph input
    that stands for the ndarray ``base``."""

    helper = staticmethod(ndarray_tensor)


ITERATOR_TYPES = (type(iter([])), type(iter(())))
# A comprehension's iterator, its ``.0`` parameter (named as ``inspect`` names it). It is
# traced where it is an argument; a loop's iterator handed to a resume function is not
# (tracing it would capture the rest of the loop once per position).
COMPREHENSION_ITERATOR = LocalSource("implicit0")


def iterator_sequence(iterator):
    """The list or tuple a list or tuple iterator walks over, read without advancing it."""
    return iterator.__reduce__()[1][0]


def iterator_position(iterator) -> int:
    """How many items a list or tuple iterator has given (0 once it is exhausted)."""
    _, _, *index = iterator.__reduce__()
    return index[0] if index else 0


def advance_iterator(iterator, count: int) -> None:
    """Take ``count`` items from ``iterator``: what the captured code consumed of it."""
    for _ in range(count):
        next(iterator)


@dataclass(frozen=True)
class IteratorSequenceSource(HelperSource):
    """The list or tuple under a list or tuple iterator the frame reads (a comprehension's
    ``.0``, a loop's iterator handed to a resume function); its items are read by their
    index there, which taking items from the iterator does not change."""

    helper = staticmethod(iterator_sequence)


def object_sources(source: Source) -> list[ObjectSource]:
    """The ObjectSources a source is built on, which guards must bind by name."""
    found = []
    while source is not None:
        if isinstance(source, ObjectSource):
            found.append(source)
        source = getattr(source, "base", None)
    return found


def item_keys(source: Source) -> dict[str, object]:
    """The dict keys a source reads items by that guards must bind by name."""
    found = {}
    while source is not None:
        if isinstance(source, ItemSource) and not is_literal_key(source.key):
            found[key_name(source.key)] = source.key
        source = getattr(source, "base", None)
    return found


def reads_program_state(source: Source) -> bool:
    """Whether ``source`` reaches its value through an attribute, a global or a closure
    cell (a parameter, a buffer, a module's attribute) rather than through the call's
    arguments and the items of argument containers."""
    while isinstance(source, (ItemSource, NdarrayTensorSource)):
        source = source.base
    return not isinstance(source, LocalSource)


def reads_module_state(source: Source) -> bool:
    """Whether ``source`` reads a module's parameter or buffer (``..._parameters['w']``,
    ``..._buffers['b']``), a global or a closure cell: state that ``dynamic=True`` keeps
    static, as opposed to what the call passes in (an argument, an item or attribute of
    one, such as a KV cache's tensors)."""
    while source is not None:
        if isinstance(source, ModuleMemberSource) and source.registry != "_modules":
            return True
        if isinstance(source, (GlobalSource, ClosureSource)):
            return True
        source = getattr(source, "base", None)
    return False
