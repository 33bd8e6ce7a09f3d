"""The ops handler that emits a kernel's define-by-run body as C++ statements.

``Kernel.body(handler)`` calls every node's inner function with this handler, then
``reduction`` and ``store``. Each call emits a statement (:mod:`kiln_cpp.statements`: for a
value, a definition ``const T tmpN = ...;``, with common subexpressions reused in the scope
that defined them) into the right place of the loop nest: nodes at the ``outer`` level go
into the body of the outer loops, nodes at the ``inner`` or ``reduction`` level into a loop
over the reduction ranges. A reduction's accumulator is declared before its loop and its
result defined after it; a node that reads a reduction result starts a new reduction loop.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import sympy
import torch

from kiln_cpp import ops_table
from kiln_cpp.dtypes import (
    LOW_PRECISION,
    convert_expr,
    load_expr,
    storage_type,
    store_expr,
    value_type,
)
from kiln_cpp.errors import CppCodegenError
from kiln_cpp.index_facts import IndexFacts
from kiln_cpp.printer import cexpr, cexpr_naming
from kiln_cpp.statements import (
    Accumulation,
    CheckIndex,
    Declare,
    Define,
    Element,
    Expr,
    PointArray,
    PointWrite,
    ReductionLoop,
    Statement,
    Store,
    Update,
    mark,
)
from kiln_cpp.vecmath import vector_function
from kiln_loopir.ir import Scatter
from kiln_loopir.kernel import Kernel
from kiln_loopir.ops import BINARY_OPS, UNARY_OPS, result_dtype

# float sums over at most this many points accumulate in float lanes, longer ones in a
# cascade of float lanes (see CppOpsHandler._sum_type)
FLOAT_SUM_MAX = 1024


class _NodeValues(dict):
    """``local_values``; ``Kernel.body`` sets an entry as each node finishes."""

    def __init__(self, on_set: Callable[[str], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        self._on_set(key)


def literal(value: object, dtype: torch.dtype) -> str:
    """A constant as a C++ expression of the value type of ``dtype``."""
    vt = value_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)  # type: ignore[arg-type]
        if math.isnan(v):
            return f"std::numeric_limits<{vt}>::quiet_NaN()"
        if math.isinf(v):
            return ("-" if v < 0 else "") + f"std::numeric_limits<{vt}>::infinity()"
        return f"static_cast<{vt}>({v!r})"
    v = int(value)  # type: ignore[arg-type]
    if v == -(2**63):
        return "std::numeric_limits<int64_t>::min()"
    return f"static_cast<{vt}>(INT64_C({v}))"


class CppOpsHandler:
    """Renders one kernel's body; ``items`` is the body of the outer loops (statements,
    see :mod:`kiln_cpp.statements`, and :class:`ReductionLoop` s), ``buffer_dtypes`` the
    dtype of every buffer it touches."""

    def __init__(
        self, kernel: Kernel, bounds: dict[sympy.Symbol, tuple[int, int]] | None = None
    ) -> None:
        """``bounds``: loop variables known to lie in ``[lo, hi)`` (a piece of the space,
        see :mod:`kiln_cpp.index_facts`)."""
        self.kernel = kernel
        self.facts = IndexFacts(dict(bounds or {}))
        self.levels = kernel.levels()
        self.nodes = kernel.nodes
        self.buffer_dtypes: dict[str, torch.dtype] = {n.name: n.buffer.dtype for n in kernel.nodes}
        self.buffer_dtypes.update(kernel.arg_dtypes)
        self.items: list[Statement | ReductionLoop] = []
        self.local_values = _NodeValues(self._node_done)
        self.dtypes: dict[str, torch.dtype] = {}
        self.has_scatter = any(isinstance(n.body, Scatter) for n in kernel.nodes)
        self._scope: dict[str, int] = {}
        self._cse: dict[tuple[int, Expr], str] = {}
        self._masks: list[str] = []
        self._loop: ReductionLoop | None = None
        self._loops = 0
        self._node = 0
        self._reduced = False
        self._count = 0
        self._spilled: set[str] = set()
        self._dead = 0  # inside a masked body whose mask is known false: no statements
        # values the same at every point of the reduction loops (read nothing that moves with
        # them), what each was computed from, and its definition; an indirect index among them is
        # computed before its loop (see hoist_invariant_indices)
        self._invariant: set[str] = set()
        self._operands: dict[str, tuple[str, ...]] = {}
        self._definitions: dict[str, Define] = {}
        self._invariant_indices: list[str] = []
        self._guards: dict[str, CheckIndex] = {}  # an invariant index -> its range check

    # -- where statements go ---------------------------------------------------------------
    def _place(self) -> tuple[list, int]:
        level = self.levels[self._node] if self._node < len(self.levels) else "outer"
        if level == "outer" or self._reduced:
            if not self._reduced:
                self._loop = None  # an outer node: the next inner node starts a new loop
            return self.items, 0
        if self._loop is None or self._loop.closed:
            self._loops += 1
            self._loop = ReductionLoop(self._loops)
            self.items.append(self._loop)
        return self._loop.body, self._loop.id

    def _node_done(self, name: str) -> None:
        self._node += 1
        self._reduced = False

    def _emit(
        self,
        rhs: str,
        dtype: torch.dtype,
        operands: tuple[str, ...] | None = None,
        element: Element | None = None,
    ) -> str:
        """The value ``rhs`` (its names marked, see :func:`kiln_cpp.statements.mark`) as a
        variable; ``operands``, where the caller gives them, are all the values it reads
        (None: it may read what moves with the reduction loops); ``element``: the value is
        that element as stored."""
        target, scope = self._place()
        expr = Expr.of(rhs)
        for key in ((scope, expr), (0, expr)):
            if key in self._cse:
                return self._cse[key]
        var = f"tmp{self._count}"
        self._count += 1
        self.dtypes[var] = dtype
        if self._dead:  # a value never computed: not written, not reused
            return var
        definition = Define(var, value_type(dtype), expr, element, _costly(str(expr)))
        target.append(definition)
        self._cse[(scope, expr)] = var
        self._scope[var] = scope
        invariant = operands is not None and not self._masks
        if scope and invariant and all(self._scope.get(o, 0) == 0 or o in self._invariant
                                       for o in operands):  # fmt: skip
            self._invariant.add(var)
            self._operands[var], self._definitions[var] = operands, definition
        return var

    def hoist_invariant_indices(self, items: list) -> list:
        """``items`` with the statements that compute an indirect index the same at every point
        of a reduction loop (an embedding's row, read once per output row) moved before
        that loop, out of its vectorised body (BERT's embedding and layer norm: 180 us
        against 33 us with the index computed per point)."""
        hoisted: set[str] = set()
        pending = list(self._invariant_indices)
        while pending:
            var = pending.pop()
            if var in self._definitions and self._definitions[var] not in hoisted:
                hoisted.add(self._definitions[var])
                pending += self._operands[var]
        hoisted |= {self._guards[v] for v in self._invariant_indices if v in self._guards}
        out: list = []
        for item in items:
            if isinstance(item, ReductionLoop) and hoisted & set(item.body):
                out += [s for s in item.body if s in hoisted]
                item.body = [s for s in item.body if s not in hoisted]
            out.append(item)
        return out

    def _visible(self, var: str) -> str:
        """``var`` as a variable of the current scope. A value computed inside another
        reduction loop is spilled there to a per-point array and read back here."""
        _, scope = self._place()
        home = self._scope.get(var, 0)
        if home in (0, scope):
            return var
        loop = next(i for i in self.items if isinstance(i, ReductionLoop) and i.id == home)
        spill = f"{var}_spill"
        if spill not in self._spilled:
            self._spilled.add(spill)
            vt = storage_type(self.dtypes[var])  # bytes for booleans (no vector<bool>)
            vt = "float" if self.dtypes[var] in LOW_PRECISION else vt
            loop.prologue.append(PointArray(var, "spill", vt, self._rnumel()))
            loop.body.append(PointWrite(var, "spill", self._rlinear(), var))
        index = self._rlinear()
        read = f"{mark(spill)}[{index}]"  # as statements.point_read(spill, index)
        return self._emit(read, self.dtypes[var], element=Element(spill, index, var))

    def _rnumel(self) -> str:
        return cexpr(sympy.expand(math.prod(self.kernel.reduction_ranges)))

    # -- structural ops --------------------------------------------------------------------
    def _buffer_dtype(self, name: str) -> torch.dtype:
        if name in self.buffer_dtypes:
            return self.buffer_dtypes[name]
        raise CppCodegenError(
            f"{self.kernel.name}: buffer {name} has no dtype in kernel.arg_dtypes; "
            "run kiln_loopir's kernel_launch_args on the schedule before rendering"
        )

    def load(self, name: str, index: sympy.Expr) -> str:
        if name in self.local_values:
            return self._visible(self.local_values[name])
        dtype = self._buffer_dtype(name)
        stored = f"{name}[{self._index(index)}]"
        element = load_expr(dtype, stored)
        plain = element == stored and not self._masks
        if self._masks:
            element = f"({mark(self._masks[-1])} ? {element} : {value_type(dtype)}(0))"
        where = Element(name, cexpr(sympy.expand(index))) if plain else None
        return self._emit(element, dtype, self._index_operands(index), where)

    def _index(self, index: sympy.Expr) -> str:
        """``index`` as C++, the values it reads (indirect indices) marked as names."""
        return cexpr_naming(sympy.expand(index), frozenset(self.dtypes))

    def _index_operands(self, index: sympy.Expr) -> tuple[str, ...] | None:
        """The values an index reads (indirect indices), or None where it moves with a
        reduction loop."""
        names = [s.name for s in sympy.sympify(index).free_symbols]
        if any(re.fullmatch(r"r\d+", n) for n in names):
            return None
        return tuple(n for n in names if n in self.dtypes)

    def constant(self, value: object, dtype: torch.dtype) -> str:
        var = self._emit(literal(value, dtype), dtype, ())
        if not dtype.is_floating_point:
            self.facts.constant(var, value)
        return var

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        rhs = f"static_cast<{value_type(dtype)}>({self._index(expr)})"
        var = self._emit(rhs, dtype, self._index_operands(expr))
        if not dtype.is_floating_point:
            self.facts.index_value(var, sympy.expand(expr))
        return var

    def to_dtype(self, x: str, dtype: torch.dtype) -> str:
        src = self.dtypes[x]
        if src == dtype:
            return x
        return self._emit(convert_expr(mark(x), src, dtype), dtype, (x,))

    def where(self, cond: str, a: str, b: str) -> str:
        dtype = result_dtype("where", self.dtypes[a], self.dtypes[b])
        if cond in self.facts.known:  # decided for this piece of the space
            return self.to_dtype(a if self.facts.known[cond] else b, dtype)
        vt = value_type(dtype)
        rhs = f"({mark(cond)} ? static_cast<{vt}>({mark(a)}) : static_cast<{vt}>({mark(b)}))"
        return self._emit(rhs, dtype, (cond, a, b))

    def masked(self, mask: str, body: Callable[[], str], other: object) -> str:
        if self._masks:
            mask = self.logical_and(self._masks[-1], mask)
        known = self.facts.known.get(mask)
        if known is True:
            return body()
        if known is False:  # traced for its dtype only
            self._dead += 1
            try:
                value = body()
            finally:
                self._dead -= 1
            return self.constant(other, self.dtypes[value])
        self._masks.append(mask)
        try:
            value = body()
        finally:
            self._masks.pop()
        dtype = self.dtypes[value]
        return self._emit(f"({mark(mask)} ? {mark(value)} : {literal(other, dtype)})", dtype)

    def indirect_indexing(self, x: str, size: sympy.Expr, mask: object = None) -> sympy.Symbol:
        """Negative indices wrap; an index out of range sets the kernel's ``kiln_oob`` flag
        (the launcher raises IndexError) and reads element 0 instead of outside memory."""
        size_c = cexpr(size)
        raw = self._emit(f"static_cast<int64_t>({mark(x)})", torch.int64, (x,))
        r = mark(raw)
        wrapped = self._emit(f"({r} < 0 ? {r} + {size_c} : {r})", torch.int64, (raw,))
        w = mark(wrapped)
        ok = self._emit(f"({w} >= 0 && {w} < {size_c})", torch.bool, (wrapped,))
        guard = f"{mark(self._masks[-1])} && !{mark(ok)}" if self._masks else f"!{mark(ok)}"
        target, _ = self._place()
        flag = CheckIndex(Expr.of(guard))
        if not self._dead:
            target.append(flag)
        var = self._emit(f"({mark(ok)} ? {w} : 0)", torch.int64, (ok, wrapped))
        if var in self._invariant:
            self._invariant_indices.append(var)
            self._guards[var] = flag
        return sympy.Symbol(var, integer=True)

    def rand(self, seed: str, offset: str) -> str:
        return self._emit(f"kiln::uniform({mark(seed)}, {mark(offset)})", torch.float32)

    def randn(self, seed: str, offset: str) -> str:
        return self._emit(f"kiln::randn({mark(seed)}, {mark(offset)})", torch.float32)

    def reduction(self, reduction_type: str, value: str, src_dtype: torch.dtype) -> str:
        value = self.to_dtype(value, src_dtype)
        self._place()  # this node's loop, even when its value needed no new statement
        loop = self._loop
        assert loop is not None and not self._reduced, "a reduction outside a reduction loop"
        acc = f"acc{self._count}"
        self._count += 1
        vt = value_type(src_dtype)
        is_float = src_dtype.is_floating_point
        out_dtype = torch.int64 if reduction_type in ("argmax", "argmin") else src_dtype
        if reduction_type in ("any", "all"):
            out_dtype = torch.bool
        pro, upd, result = self._reduction_parts(reduction_type, acc, value, vt, is_float,
                                                 src_dtype)  # fmt: skip
        loop.prologue += pro
        loop.body += upd
        # a float sum adds in vector lanes of its value type (vectorize.reduction_loop),
        # a long one in a cascade of them, as eager's
        in_lanes = is_float and reduction_type in ("dot", "sum")
        cascade = in_lanes and reduction_type == "sum" and not self._short_sum()
        loop.reductions.append(
            Accumulation(
                reduction_type, acc, value, src_dtype, upd, vt if in_lanes else None, cascade
            )
        )
        loop.closed = True
        self._reduced = True
        return self._emit(f"static_cast<{value_type(out_dtype)}>({result})", out_dtype)

    def scan(self, scan_type: str, value: str, src_dtype: torch.dtype) -> str:
        """The running value at this step of the scan loop (walked in order, never
        vectorised): its accumulator is declared before the loop, updated in it."""
        value = self.to_dtype(value, src_dtype)
        self._place()
        loop = self._loop
        assert loop is not None, "a scan outside a scan loop"
        loop.scan_start, loop.scanned = len(loop.body), value
        acc = f"acc{self._count}"
        self._count += 1
        vt = value_type(src_dtype)
        wide = "double" if src_dtype.is_floating_point else vt  # as ATen's CPU scans
        lim = f"std::numeric_limits<{vt}>"
        step = f"r{len(self.kernel.reduction_ranges) - 1}"
        a, v = mark(acc), mark(value)
        if scan_type in ("sum", "prod"):
            op = "+" if scan_type == "sum" else "*"
            init = "0" if scan_type == "sum" else "1"
            loop.prologue.append(Declare(acc, wide, init))
            loop.body.append(_update(acc, f"{a} = {a} {op} static_cast<{wide}>({v});"))
            return self._emit(f"static_cast<{vt}>({a})", src_dtype)
        if scan_type == "logsumexp":
            lim_d = "std::numeric_limits<double>"
            loop.prologue.append(Declare(acc, "double", f"-{lim_d}::infinity()"))
            update = f"{a} = kiln::log_add_exp(static_cast<double>({v}), {a});"
            loop.body.append(_update(acc, update))
            return self._emit(f"static_cast<{vt}>({a})", src_dtype)
        if scan_type in ("max", "min"):
            if src_dtype.is_floating_point:
                init = f"-{lim}::infinity()" if scan_type == "max" else f"{lim}::infinity()"
                update = f"kiln::{scan_type}_float<{vt}>({a}, {v})"
            else:
                init = f"{lim}::lowest()" if scan_type == "max" else f"{lim}::max()"
                update = f"std::{scan_type}<{vt}>({a}, {v})"
            loop.prologue.append(Declare(acc, vt, init))
            loop.body.append(_update(acc, f"{a} = {update};"))
            return self._emit(a, src_dtype)
        if scan_type in ("argmax", "argmin"):
            # ATen's cummax/cummin: the latest of equal values, a NaN once seen and its
            # latest position
            cmp = ">=" if scan_type == "argmax" else "<="
            best = mark(f"{acc}_v")
            better = f"{v} {cmp} {best}"
            if src_dtype.is_floating_point:
                better = f"std::isnan({v}) || (!std::isnan({best}) && {better})"
            loop.prologue += [Declare(f"{acc}_v", vt, f"{vt}(0)"), Declare(acc, "int64_t", "0")]
            loop.body.append(
                _update(acc, f"if ({step} == 0 || {better}) {{ {best} = {v}; {a} = {step}; }}")
            )
            return self._emit(a, torch.int64)
        raise CppCodegenError(f"kiln-cpp does not render scan {scan_type!r} yet")

    def _reduction_parts(self, kind, acc, value, vt, is_float, src_dtype):
        """``(declarations, updates, result)`` of a reduction into ``acc``; the result's
        names are marked."""
        is_bool = src_dtype == torch.bool
        lim = f"std::numeric_limits<{vt}>"
        a, v = mark(acc), mark(value)

        def plain(ctype: str, init: str, update: str):
            return [Declare(acc, ctype, init)], [_update(acc, update)], a

        if kind == "dot":  # a matrix product's sum: in float, as BLAS accumulates
            return plain(vt, "0", f"{a} += {v};")
        if kind == "sum":
            at = self._sum_type(vt) if is_float else vt
            if is_bool:
                return plain("bool", "false", f"{a} = {a} || {v};")
            return plain(at, "0", f"{a} += {v};")
        if kind == "prod":
            at = "double" if is_float else vt
            if is_bool:
                return plain("bool", "true", f"{a} = {a} && {v};")
            return plain(at, "1", f"{a} *= {v};")
        if kind in ("max", "min"):
            if is_bool:
                op = "||" if kind == "max" else "&&"
                init = "false" if kind == "max" else "true"
                return plain("bool", init, f"{a} = {a} {op} {v};")
            if is_float:
                init = f"-{lim}::infinity()" if kind == "max" else f"{lim}::infinity()"
                fn = f"kiln::{kind}_float"
            else:
                init = f"{lim}::lowest()" if kind == "max" else f"{lim}::max()"
                fn = f"std::{kind}"
            return plain(vt, init, f"{a} = {fn}<{vt}>({a}, {v});")
        if kind in ("any", "all"):
            init, op = ("false", "||") if kind == "any" else ("true", "&&")
            return plain("bool", init, f"{a} = {a} {op} static_cast<bool>({v});")
        if kind in ("argmax", "argmin"):
            cmp = ">" if kind == "argmax" else "<"
            best = mark(f"{acc}_v")
            better = f"({v} {cmp} {best})"
            if is_float:
                better = f"((std::isnan({v}) && !std::isnan({best})) || " + (
                    f"(!std::isnan({best}) && {v} {cmp} {best}))"
                )
            update = f"if ({a} < 0 || {better}) {{ {best} = {v}; {a} = {self._rlinear()}; }}"
            declare = [Declare(f"{acc}_v", vt, f"{vt}(0)"), Declare(acc, "int64_t", "-1")]
            return declare, [_update(acc, update)], a
        if kind in ("welford.mean", "welford.m2"):
            # the mean of nothing is NaN, as in eager; its m2 is 0
            result = f"({a}.n ? {a}.mean : NAN)" if kind == "welford.mean" else f"{a}.m2"
            declare = Declare(acc, f"kiln::Welford<{vt}>")
            return [declare], [_update(acc, f"{a}.update({v});")], result
        raise CppCodegenError(f"kiln-cpp does not render reduction {kind!r} yet")

    def _sum_type(self, vt: str) -> str:
        """A float sum's accumulator: in its own type over at most :data:`FLOAT_SUM_MAX`
        points (each vector lane adds at most a few dozen of them), in double over more or
        unknown sizes. A long sum's lanes still add in the value type, in a cascade
        (``kiln::CascadeLanes``); the double accumulator takes their total, the scalar
        tail, and every point where the loop cannot be vectorised."""
        return vt if self._short_sum() else "double"

    def _short_sum(self) -> bool:
        """Whether a sum takes at most :data:`FLOAT_SUM_MAX` points (a static size)."""
        points = sympy.expand(math.prod(self.kernel.reduction_ranges))
        return bool(points.is_Integer and int(points) <= FLOAT_SUM_MAX)

    def _rlinear(self) -> str:
        """The row-major position in the reduction ranges of the current point."""
        out = sympy.S.Zero
        for i, size in enumerate(self.kernel.reduction_ranges):
            out = out * size + sympy.Symbol(f"r{i}", integer=True, nonnegative=True)
        return cexpr(sympy.expand(out))

    def store(self, name: str, index: sympy.Expr, value: str, accumulate: bool = False) -> None:
        target, _ = self._place()
        dtype = self.buffer_dtypes[name]
        element = f"{name}[{self._index(index)}]"
        value = self.to_dtype(value, dtype) if self.dtypes[value] != dtype else value
        marked = mark(value)
        if accumulate:
            marked = f"({load_expr(dtype, element)} + {marked})"
        target.append(Store(Expr.of(element), Expr.of(store_expr(dtype, marked))))
        if isinstance(self.nodes[self._node].body, Scatter):
            self._node_done(name)

    # -- elementwise ops -------------------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., str]:
        if name not in UNARY_OPS and name not in BINARY_OPS:
            raise AttributeError(f"the ops handler has no operation {name!r}")
        arity = 1 if name in UNARY_OPS else 2

        def op(*args: str) -> str:
            decided = self.facts.decide(name, args)
            if isinstance(decided, bool):
                var = self._emit("true" if decided else "false", torch.bool)
                self.facts.known[var] = decided
                return var
            if decided is not None and self.dtypes[decided] == torch.bool:
                return decided
            dtypes = [self.dtypes[a] for a in args]
            dtype = result_dtype(name, *dtypes)
            operand = result_dtype("add", *dtypes)
            fn = vector_function(name, operand) or ops_table.table(operand, arity).get(name)
            if fn is None:
                raise CppCodegenError(f"kiln-cpp does not render {name} on {operand} yet")
            vt = value_type(operand)
            casted = [
                mark(a) if d == operand else f"static_cast<{vt}>({mark(a)})"
                for a, d in zip(args, dtypes, strict=True)
            ]
            return self._emit(fn(*casted), dtype, args)

        return op


def _update(acc: str, marked: str) -> Update:
    return Update(acc, Expr.of(marked))


def _costly(rhs: str) -> bool:
    """Whether an expression calls a function or divides, as the handler wrote it."""
    return "kiln::" in rhs or "std::" in rhs or " / " in rhs


def pointer_type(dtype: torch.dtype) -> str:
    return storage_type(dtype) + "*"
