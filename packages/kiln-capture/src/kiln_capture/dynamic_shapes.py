"""Which sizes a capture makes symbolic.

- ``dynamic=None`` (the default): every size is static until a call misses because of it;
  then every dimension whose size changed (in all the guards the call failed, not only
  the first) is symbolic from the next capture on, and an int argument whose value changed
  is a graph input;
- ``dynamic=True``: every dimension of every tensor the call passes in (arguments and what
  they hold; not parameters and buffers) is symbolic from the first capture;
- ``dynamic=False``: never, except where the user marks a dimension;
- ``mark_dynamic(t, dim, min=, max=)`` makes ``t``'s dimension symbolic wherever ``t`` is
  captured (within ``[min, max]``: the guard checks the range), ``mark_static(t, dim)``
  keeps it static whatever the setting.

A symbolic tensor's storage offset of 0 or 1 is fixed by torch's shape environment, as
sizes of 0 and 1 are; it is guarded only where the graph reads offsets
(:func:`without_unread_offsets`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from kiln_capture.guards import GuardFailure

DYNAMIC_MARKS = "_kiln_dynamic_dims"  # dim -> (min, max), either None where unbounded
STATIC_MARKS = "_kiln_static_dims"  # dims


def _dims(t: torch.Tensor, dim) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    dims = list(range(t.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    out = []
    for d in dims:
        if not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"dimension {d} is out of range for a tensor of {t.dim()} dims")
        out.append(d % t.dim())
    return out


def mark_dynamic(t: torch.Tensor, dim, *, min: int | None = None, max: int | None = None):
    """Make dimension ``dim`` (an int or a list) of ``t`` symbolic wherever ``t`` is
    captured, from the first capture on. ``min``/``max`` bound the sizes the graph accepts:
    a call outside them captures again. Returns ``t``."""
    for d in _dims(t, dim):
        size = t.size(d)
        if (min is not None and size < min) or (max is not None and size > max):
            raise ValueError(
                f"mark_dynamic: size {size} of dimension {d} is outside [{min}, {max}]"
            )
        marks = dict(getattr(t, DYNAMIC_MARKS, {}))
        marks[d] = (min, max)
        setattr(t, DYNAMIC_MARKS, marks)
        setattr(t, STATIC_MARKS, getattr(t, STATIC_MARKS, frozenset()) - {d})
    return t


def mark_static(t: torch.Tensor, dim=None):
    """Keep dimension ``dim`` of ``t`` (every one if None) static, whatever ``dynamic``
    says and however often its size changes. Returns ``t``."""
    dims = set(_dims(t, dim))
    setattr(t, STATIC_MARKS, getattr(t, STATIC_MARKS, frozenset()) | dims)
    marks = {d: r for d, r in getattr(t, DYNAMIC_MARKS, {}).items() if d not in dims}
    setattr(t, DYNAMIC_MARKS, marks)
    return t


def marked_static(t: torch.Tensor) -> frozenset[int]:
    return getattr(t, STATIC_MARKS, frozenset())


@dataclass
class DynamicSizes:
    """A captured function's choice of symbolic sizes, kept across its captures."""

    mode: bool | None = None
    dims: dict[str, set[int]] = field(default_factory=dict)  # tensor expr -> dims (automatic)
    ints: set[str] = field(default_factory=set)  # int argument exprs that are graph inputs

    def tensor_dims(self, expr: str, value: torch.Tensor, is_state: bool) -> dict:
        """The symbolic dimensions of the tensor ``expr``: dim -> its (min, max) where the
        user marked it (the code must keep it symbolic), None where capture chose it;
        ``is_state``: a parameter or buffer, which ``dynamic=True`` leaves static."""
        dims: dict = {}
        if self.mode is True and not is_state:
            dims = dict.fromkeys(range(value.dim()))
        elif self.mode is None:
            dims = dict.fromkeys(self.dims.get(expr, ()))
        marked = getattr(value, DYNAMIC_MARKS, {})
        dims.update(marked)
        if marked and self.mode is not False:  # later tensors in its place stay symbolic
            self.dims.setdefault(expr, set()).update(marked)
        static = marked_static(value)
        return {d: r for d, r in dims.items() if d not in static and d < value.dim()}

    def note_failures(self, failures: list[GuardFailure]) -> list[str]:
        """After a miss, make what changed symbolic: every dimension whose size changed in
        a failed tensor guard and every int argument whose value changed. Returns what was
        made symbolic, for the log."""
        if self.mode is False:
            return []
        made = []
        for failure in failures:
            guard, value = failure.guard, failure.value
            if guard.shape is not None and isinstance(value, torch.Tensor):
                if value.dim() != len(guard.shape):
                    continue
                changed = {
                    d
                    for d, (old, new) in enumerate(zip(guard.shape, value.shape, strict=True))
                    if old is not None and old != new and d not in marked_static(value)
                }
                known = self.dims.setdefault(guard.subject, set())
                made += [f"{guard.subject}.size({d})" for d in sorted(changed - known)]
                known.update(changed)
            elif is_int_guard(failure) and guard.subject not in self.ints:
                self.ints.add(guard.subject)
                made.append(guard.subject)
        return made


# an argument or an item of one (``n``, ``args[1]``, ``kwargs['steps']``); an int read from
# an attribute (a module's, a config's) stays a constant
ARGUMENT_EXPR = re.compile(r"[A-Za-z_]\w*(\[(\d+|'[^']*')\])*")


def is_int_guard(failure: GuardFailure) -> bool:
    """An int argument compared by value that the call passes with another int value."""
    guard = failure.guard
    return (
        guard.subject is not None
        and ARGUMENT_EXPR.fullmatch(guard.subject) is not None
        and guard.code.startswith(f"type({guard.subject}) is int and ")
        and type(failure.value) is int
    )


# A dynamic input's storage offset of 0 or 1 is fixed by the shape environment and guarded.
# A graph that never reads offsets (every compiled graph reads its inputs where they start)
# needs no such guard: without it, an input that comes as a view at an offset (a CUDA
# graph's outputs, one block for all) is no new capture.
ZERO_ONE_OFFSET = re.compile(r"[\w.\[\]'\"]+\.storage_offset\(\) == [01]")
# What reads where a tensor starts in its storage: an offset read, or a view placed at an
# offset counted from the storage's start
OFFSET_READERS = {"storage_offset", "as_strided", "as_strided_", "as_strided_scatter", "set_"}


def without_unread_offsets(
    guards: list[str], graph: torch.fx.Graph, read_by_code: bool
) -> list[str]:
    """``guards`` less those on a storage offset of 0 or 1, where neither the captured code
    (``read_by_code``: it asked a tensor's offset, a number the graph keeps) nor ``graph``
    reads one."""
    if read_by_code:
        return guards
    for node in graph.nodes:
        if node.op in ("call_method", "call_function"):
            target = node.target
            name = target if isinstance(target, str) else getattr(target, "__name__", "")
            if name in OFFSET_READERS:
                return guards
    return [code for code in guards if not ZERO_ONE_OFFSET.fullmatch(code)]
