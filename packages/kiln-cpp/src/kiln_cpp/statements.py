"""The statements of a kernel body, as the handler emits them and the passes rewrite them.

The handler (:mod:`kiln_cpp.handler`) emits a kernel's body as statements at the level of
the outer loops and :class:`ReductionLoop` s holding theirs. Each statement is one line of
C++ once rendered, and knows the names it defines and reads: the passes that fuse loops
(:mod:`kiln_cpp.loops`), vectorise (:mod:`kiln_cpp.vectorize`, :mod:`kiln_cpp.columns`) and
split reductions (:mod:`kiln_cpp.split`) decide on these fields and render the text only at
the end. An expression (:class:`Expr`) keeps the names it reads apart from its text, so a
pass can rename them (a value a fused loop already computes) without reading the text.

The names are the handler's values (``tmpN``), accumulators (``accN``, ``accN_v``) and the
per-point arrays of values (``tmpN_spill``, ``tmpN_xs``: see :class:`PointArray`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

# wraps each name the handler writes into an expression's text (see Expr.of)
_MARK = "\x00"


def mark(value: str) -> str:
    """``value`` marked as a name in the text of an expression being built."""
    return f"{_MARK}{value}{_MARK}"


@dataclass(frozen=True)
class Expr:
    """A C++ expression: ``parts`` alternate text and the names it reads
    (``text, name, text, ..., text``)."""

    parts: tuple[str, ...]

    @classmethod
    def of(cls, marked: str) -> Expr:
        """The expression whose text is ``marked`` with its names wrapped by :func:`mark`."""
        return cls(tuple(marked.split(_MARK)))

    @property
    def reads(self) -> tuple[str, ...]:
        return self.parts[1::2]

    def renamed(self, names: Mapping[str, str]) -> Expr:
        """The expression reading ``names[n]`` where it read ``n``."""
        return Expr(tuple(names.get(p, p) if i % 2 else p for i, p in enumerate(self.parts)))

    def __str__(self) -> str:
        return "".join(self.parts)


def point_read(array: str, index: str) -> Expr:
    """``array[index]``: a value read back from its per-point array."""
    return Expr(("", array, f"[{index}]"))


@dataclass(frozen=True)
class Element:
    """A value that is the element ``array[index]`` as stored (no conversion, no mask);
    ``home``: for a per-point array (:class:`PointArray`), the value it keeps."""

    array: str
    index: str
    home: str | None = None


@dataclass(frozen=True)
class Define:
    """``const ctype name = expr;``. ``costly``: the expression calls a function or divides
    (worth storing rather than computing twice, see
    :func:`kiln_cpp.loops.reuse_across_loops`)."""

    name: str
    ctype: str
    expr: Expr
    element: Element | None = None
    costly: bool = False

    @property
    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    @property
    def reads(self) -> tuple[str, ...]:
        return self.expr.reads

    @property
    def key(self) -> tuple[str, Expr]:
        """Equal for two definitions of the same value."""
        return self.ctype, self.expr

    def renamed(self, names: Mapping[str, str]) -> Define:
        return replace(self, expr=self.expr.renamed(names))

    def render(self) -> str:
        return f"const {self.ctype} {self.name} = {self.expr};"


@dataclass(frozen=True)
class Store:
    """``target = value;``: an element of an output buffer written."""

    target: Expr
    value: Expr
    defines = ()

    @property
    def reads(self) -> tuple[str, ...]:
        return self.target.reads + self.value.reads

    def renamed(self, names: Mapping[str, str]) -> Store:
        return Store(self.target.renamed(names), self.value.renamed(names))

    def render(self) -> str:
        return f"{self.target} = {self.value};"


@dataclass(frozen=True)
class CheckIndex:
    """Where ``cond`` holds, an indirect index was out of range: the kernel's ``kiln_oob``
    flag is set (an atomic store), or, in a ``simd`` loop (which may hold no atomics),
    ``flag`` ORs it in (a ``reduction(|:flag)`` variable of the loop)."""

    cond: Expr
    flag: str | None = None
    defines = ()

    @property
    def reads(self) -> tuple[str, ...]:
        return self.cond.reads

    def renamed(self, names: Mapping[str, str]) -> CheckIndex:
        return replace(self, cond=self.cond.renamed(names))

    def render(self) -> str:
        if self.flag is None:
            return f"if ({self.cond}) __atomic_store_n(&kiln_oob, 1, __ATOMIC_RELAXED);"
        return f"{self.flag} |= ({self.cond});"


@dataclass(frozen=True)
class Declare:
    """An accumulator declared before its loop: ``ctype name = init;``, ``ctype name;``
    without ``init`` (a ``kiln::Welford``, empty when made), or ``ctype& name = twin;``
    (a reference to another accumulator of the same values)."""

    name: str
    ctype: str
    init: str | None = None
    twin: str | None = None

    @property
    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    @property
    def reads(self) -> tuple[str, ...]:
        return () if self.twin is None else (self.twin,)

    def renamed(self, names: Mapping[str, str]) -> Declare:
        return self

    def render(self) -> str:
        if self.twin is not None:
            return f"{self.ctype}& {self.name} = {self.twin};"
        if self.init is None:
            return f"{self.ctype} {self.name};"
        return f"{self.ctype} {self.name} = {self.init};"


@dataclass(frozen=True)
class Update:
    """A step of accumulator ``acc``: ``expr`` is the whole statement (``acc += tmp3;``)."""

    acc: str
    expr: Expr
    defines = ()

    @property
    def reads(self) -> tuple[str, ...]:
        return self.expr.reads

    def renamed(self, names: Mapping[str, str]) -> Update:
        return replace(self, expr=self.expr.renamed(names))

    def render(self) -> str:
        return str(self.expr)


@dataclass(frozen=True)
class PointArray:
    """An array of one value per reduction point, declared before the loop that fills it:
    ``home``'s value kept for a later loop, a ``"spill"`` (the handler's: the later loop
    reads a value of another) or ``"xs"`` (kept to save computing it again)."""

    home: str
    kind: str
    ctype: str
    size: str
    on_stack: bool = False

    @property
    def name(self) -> str:
        return f"{self.home}_{self.kind}"

    @property
    def defines(self) -> tuple[str, ...]:
        return (self.name,)

    reads = ()

    def renamed(self, names: Mapping[str, str]) -> PointArray:
        return self

    def render(self) -> str:
        if self.on_stack:
            return f"alignas(64) {self.ctype} {self.name}[{self.size}];"
        return f"std::vector<{self.ctype}> {self.name}({self.size});"


@dataclass(frozen=True)
class PointWrite:
    """``home_kind[index] = value;``: the value of the current point kept in ``home``'s
    per-point array (``value`` is ``home`` unless a fused loop renamed it)."""

    home: str
    kind: str
    index: str
    value: str
    defines = ()

    @property
    def array(self) -> str:
        return f"{self.home}_{self.kind}"

    @property
    def reads(self) -> tuple[str, ...]:
        return (self.value,)

    def renamed(self, names: Mapping[str, str]) -> PointWrite:
        return replace(self, value=names.get(self.value, self.value))

    def render(self) -> str:
        return f"{self.array}[{self.index}] = {self.value};"


Statement = Define | Store | CheckIndex | Declare | Update | PointArray | PointWrite


def names(statement: Statement) -> set[str]:
    """The names ``statement`` defines or reads."""
    return {*statement.defines, *statement.reads}


def per_point(statement: Statement) -> bool:
    """Whether ``statement`` declares, writes or reads a per-point array."""
    if isinstance(statement, Define):
        return statement.element is not None and statement.element.home is not None
    return isinstance(statement, PointArray | PointWrite)


def render(statements: list[Statement]) -> list[str]:
    return [s.render() for s in statements]


@dataclass
class Accumulation:
    """One reduction of a :class:`ReductionLoop`: its accumulator
    ``acc``, the value it reduces and the scalar ``update`` statements the handler put in
    the loop body."""

    kind: str
    acc: str
    value: str
    dtype: torch.dtype
    update: list[Update]
    # a sum accumulated in this C++ type, which may add in lanes (see
    # kiln_cpp.vectorize.reduction_loop)
    lane_type: str | None = None
    # a long sum: its lanes add in a cascade (``kiln::CascadeLanes``), as eager's
    cascade: bool = False


@dataclass
class ReductionLoop:
    """A loop over the kernel's reduction ranges, in the body of the outer loops."""

    id: int
    prologue: list[Statement] = field(default_factory=list)
    body: list[Statement] = field(default_factory=list)
    closed: bool = False  # a reduction finished here: later nodes need a new loop
    reductions: list[Accumulation] = field(default_factory=list)
    # a scan loop: where the scan's update starts in ``body``, and the value it scans
    scan_start: int | None = None
    scanned: str | None = None
