"""What a kernel's body compares its loop variables against, and what those comparisons give
on a piece of the iteration space.

``cat``, padding and slice scatters choose each point's source by comparing an index with
constants (``x0 >= 1048576``). Rendered as they are, every point computes every source and
selects one (a ``cat`` of ``sin`` and ``cos`` computes both). :class:`IndexFacts` records
those comparisons as the handler renders them (:attr:`IndexFacts.cuts`: where a loop
variable's comparisons change value), so the renderer can split the loop there
(:func:`pieces`); rendering each piece again with the loop variable's bounds known, the
comparisons become constants, ``masked`` and ``where`` keep only the side that runs, and
each piece is a plain loop the compiler vectorises.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

_COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
# at most this many pieces per kernel: each is a loop nest of its own
MAX_PIECES = 16


@dataclass
class IndexFacts:
    """Integer intervals of index values and the booleans they decide, for one rendering.

    ``bounds`` are the piece's loop variables: ``lo <= x < hi``."""

    bounds: dict[sympy.Symbol, tuple[int, int]] = field(default_factory=dict)
    intervals: dict[str, tuple[int, int]] = field(default_factory=dict)  # inclusive
    # value -> (the loop variable, c): the value is the variable plus c
    loop_values: dict[str, tuple[sympy.Symbol, int]] = field(default_factory=dict)
    known: dict[str, bool] = field(default_factory=dict)
    cuts: dict[sympy.Symbol, set[int]] = field(default_factory=dict)

    def index_value(self, var: str, expr: sympy.Expr) -> None:
        """``var`` holds the index expression ``expr``."""
        if expr.is_Integer:
            self.intervals[var] = (int(expr), int(expr))
            return
        symbols = expr.free_symbols
        if len(symbols) != 1:
            return
        (x,) = symbols
        offset = sympy.expand(expr - x)
        if not isinstance(x, sympy.Symbol) or not offset.is_Integer:
            return
        self.loop_values[var] = (x, int(offset))
        if x in self.bounds:
            lo, hi = self.bounds[x]
            self.intervals[var] = (lo + int(offset), hi - 1 + int(offset))

    def constant(self, var: str, value: object) -> None:
        if isinstance(value, bool):
            self.known[var] = value
        elif isinstance(value, int):
            self.intervals[var] = (value, value)

    def decide(self, op: str, args: tuple[str, ...]) -> bool | str | None:
        """The op's value where the facts decide it: a bool, or the operand it equals
        (``logical_and(true, b)`` is ``b``); None where they do not."""
        if op in _COMPARISONS:
            a, b = args
            self._record_cut(op, a, b)
            return self._compare(op, a, b)
        if op == "logical_not":
            (a,) = args
            return (not self.known[a]) if a in self.known else None
        if op in ("logical_and", "logical_or"):
            a, b = args
            absorbing = op == "logical_or"  # or(true, _) is true, and(false, _) is false
            for x, other in ((a, b), (b, a)):
                if x in self.known:
                    return absorbing if self.known[x] == absorbing else other
        return None

    def _compare(self, op: str, a: str, b: str) -> bool | None:
        if a not in self.intervals or b not in self.intervals:
            return None
        (alo, ahi), (blo, bhi) = self.intervals[a], self.intervals[b]
        if op in ("gt", "ge"):
            (alo, ahi), (blo, bhi), op = (blo, bhi), (alo, ahi), _FLIPPED[op]
        if op == "lt":
            return True if ahi < blo else False if alo >= bhi else None
        if op == "le":
            return True if ahi <= blo else False if alo > bhi else None
        disjoint = ahi < blo or bhi < alo
        single = alo == ahi == blo == bhi
        equal = True if single else False if disjoint else None
        return equal if op == "eq" or equal is None else not equal

    def _record_cut(self, op: str, a: str, b: str) -> None:
        """Where ``x + k op c`` (or ``c op x + k``) changes value along the loop variable
        ``x``."""
        if b in self.loop_values and a not in self.loop_values:
            a, b, op = b, a, _FLIPPED[op]
        if a not in self.loop_values or b not in self.intervals:
            return
        c, c_hi = self.intervals[b]
        if c != c_hi:
            return
        x, offset = self.loop_values[a]
        c -= offset
        at = {"lt": [c], "ge": [c], "le": [c + 1], "gt": [c + 1]}.get(op, [c, c + 1])
        self.cuts.setdefault(x, set()).update(at)


def pieces(
    cuts: dict[sympy.Symbol, set[int]], variables: list[sympy.Symbol], ranges: list[sympy.Expr]
) -> tuple[int, list[tuple[int, int]]] | None:
    """``(dimension, [(lo, hi), ...])``: the pieces of the innermost loop of static size
    whose comparisons change inside it, or None where no loop splits (or into too many)."""
    for d in reversed(range(len(variables))):
        size = ranges[d]
        if not size.is_Integer:
            continue
        inside = sorted(c for c in cuts.get(variables[d], ()) if 0 < c < int(size))
        if not inside or len(inside) >= MAX_PIECES:
            continue
        edges = [0, *inside, int(size)]
        return d, list(zip(edges[:-1], edges[1:], strict=True))
    return None
