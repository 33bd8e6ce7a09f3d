"""A kernel as Triton source: one ``@triton.jit`` function per variant (marked
``@kt.jit_later``: made one at its first use, :mod:`kiln_triton.variants`) and its launch
metadata (``META``), read by :mod:`kiln_triton.launcher`.

Pointwise kernels have one variant over 1-D or 2-D blocks (see :mod:`kiln_triton.tiling`).
Kernels with reduction ranges have two, and the launcher picks one by the size of the
reduction: ``persistent`` holds whole rows in registers (``RBLOCK`` covers the reduction,
every value is computed once), ``looped`` walks the reduction in chunks of ``RBLOCK`` with
per-lane accumulators; a value that needs a reduction's result starts a new loop, and the
loads it needs are repeated there.

The functions are named for what the kernel computes, without its index in the graph:
``kiln_fused_layer_norm_gelu`` (pointwise), ``kiln_softmax_persistent`` and
``kiln_softmax_looped`` (see :mod:`kiln_loopir.names`); the module's first line names the
IR kernel (``# kiln_softmax_1: ...``) and is left out of its hash. Nothing else names the
graph's buffers: pointers are ``in_ptr0``, ``out_ptr0``..., in the functions and in
``META`` alike, so the same kernel of every layer is one module, compiled and tuned once.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy
import torch

from kiln_loopir.kernel import Kernel
from kiln_loopir.names import describe
from kiln_loopir.ops import result_dtype
from kiln_loopir.symbols import index_vars, py_expr, reduction_vars
from kiln_triton import ops_table
from kiln_triton.dtypes import LOW_PRECISION, compute_type, convert
from kiln_triton.errors import TritonCodegenError
from kiln_triton.literals import literal
from kiln_triton.printer import texpr
from kiln_triton.reductions import ReductionRendering
from kiln_triton.scans import ScanRendering
from kiln_triton.split import finish_function, has_epilogue, split_function, split_parts
from kiln_triton.tiling import Tiling, choose_tiling, column_major, merge_dims
from kiln_triton.values import RecordingHandler, Store, Value, record

HEADER = """\
import triton
import triton.language as tl

from kiln_triton import device as kt
"""


@dataclass
class LoopPlan:
    """The looped variant's layout: see :meth:`KernelRenderer.loop_plan`."""

    position: dict[str, int]
    store_pos: list[int]
    loop: dict[str, int]
    need: Callable[[Value], int]
    nloops: int


@dataclass
class Space:
    """The iteration space after merging: variables by group and what masks them."""

    tiling: Tiling
    subs: dict
    xvars: list
    rvars: list

    def group_of(self, s: sympy.Symbol) -> str | None:
        if s in self.rvars:
            return "r"
        if s in self.xvars:
            if self.tiling.kind == "tiled" and self.xvars.index(s) < self.tiling.split:
                return "y"
            return "x"
        return None


class KernelRenderer(ReductionRendering, ScanRendering):
    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        # the functions are named for the kernel's ops without its index in the graph
        # (``kiln_fused_layer_norm_gelu``, ``..._looped``, ``..._split``): profiles read,
        # and the same kernel in every layer stays one source
        self.name = describe(kernel.nodes)
        self.rec: RecordingHandler = record(kernel)
        # pointers get canonical names, so the same kernel in every layer of a model is one
        # source (compiled once)
        stored = set(kernel.stored_buffers())
        self.pointer: dict[str, str] = {}
        for a in kernel.args:
            prefix = "out_ptr" if a in stored else "in_ptr"
            self.pointer[a] = f"{prefix}{sum(p.startswith(prefix) for p in self.pointer.values())}"
        self.space = self._space()
        self.lines: list[str] = []
        self._loop_plan: LoopPlan | None = None

    # -- the iteration space -------------------------------------------------------------------
    def _space(self) -> Space:
        """The kernel's iteration space (:func:`merged_space`), its indices rewritten in
        the merged variables."""
        k, rec = self.kernel, self.rec
        indexed = [v for v in rec.values if "index" in v.attrs]
        merged = merged_space(
            tuple(k.ranges),
            tuple(k.reduction_ranges),
            tuple((v.op, v.attrs["index"]) for v in indexed),
            tuple(s.index for s in rec.stores),
        )
        tiling, subs, xvars, rvars, indices, store_indices = merged
        for v, index in zip(indexed, indices, strict=True):
            v.attrs["index"] = index
        for s, index in zip(rec.stores, store_indices, strict=True):
            s.index = index
        mine = Tiling(tiling.kind, list(tiling.ranges), list(tiling.reduction_ranges), tiling.split)
        return Space(mine, dict(subs), list(xvars), list(rvars))

    def _index_groups(self, expr: sympy.Expr) -> set[str]:
        groups = set()
        for s in sympy.sympify(expr).free_symbols:
            g = self.space.group_of(s)
            if g:
                groups.add(g)
            elif s.name in self.rec.indirect:
                groups |= self._value_groups(self.rec.indirect[s.name])
        return groups

    def _value_groups(self, v: Value) -> set[str]:
        if "groups" in v.attrs:
            return v.attrs["groups"]
        groups: set[str] = set()
        if "index" in v.attrs:
            groups |= self._index_groups(v.attrs["index"])
        for a in v.args:
            groups |= self._value_groups(a)
        if v.op == "reduction":
            groups.discard("r")
        v.attrs["groups"] = groups
        return groups

    # -- masks and shapes ----------------------------------------------------------------------
    def _level(self, inner: bool) -> list[str]:
        """The groups of the block a value of this level spans."""
        kind = self.space.tiling.kind
        if kind == "tiled":
            return ["y", "x"]
        if kind == "pointwise":
            return ["x"]
        return ["x", "r"] if inner else ["x"]

    def _shape(self, groups: list[str]) -> str:
        kind = self.space.tiling.kind
        if kind == "pointwise":
            return "[XBLOCK]"
        if kind == "tiled":
            return (
                "["
                + ("YBLOCK" if "y" in groups else "1")
                + ", "
                + ("XBLOCK" if "x" in groups else "1")
                + "]"
            )
        return (
            "["
            + ("XBLOCK" if "x" in groups else "1")
            + ", "
            + ("RBLOCK" if "r" in groups else "1")
            + "]"
        )

    @staticmethod
    def _mask(groups, extra: Value | None = None) -> str | None:
        parts = [f"{g}mask" for g in ("y", "x", "r") if g in groups]
        if extra is not None:
            parts.append(extra.name)
        return " & ".join(parts) if parts else None

    def _pointer(self, buffer: str, index: sympy.Expr, have: set[str], need: list[str]) -> str:
        ptr = f"{buffer} + {texpr(index)}"
        if any(
            g not in have for g in need
        ):  # a broadcast access: the pointer takes the mask's shape
            ptr += f" + tl.zeros({self._shape(need)}, tl.int32)"
        return ptr

    # -- one value -----------------------------------------------------------------------------
    def value_lines(self, v: Value) -> list[str]:
        a = [x.name for x in v.args]
        n, op = v.name, v.op
        if op == "load":
            return [f"{n} = {self._load(v)}"]
        if op == "constant":
            lit = literal(v.attrs["value"], v.dtype)
            return [f"{n} = tl.full([], {lit}, {compute_type(v.dtype)})"]
        if op == "index":
            expr = texpr(v.attrs["index"])
            return [f"{n} = (tl.zeros([], tl.int64) + {expr}).to({compute_type(v.dtype)})"]
        if op == "convert":
            return [f"{n} = {convert(a[0], v.args[0].dtype, v.dtype)}"]
        if op == "where":
            b, c = (self._cast(x, v.dtype) for x in v.args[1:])
            return [f"{n} = tl.where({a[0]}, {b}, {c})"]
        if op == "masked":
            other = literal(v.attrs["other"], v.dtype)
            return [f"{n} = tl.where({a[0]}, {a[1]}, {other})"]
        if op == "indirect":
            # negative indices wrap; one out of range reads element 0 rather than outside memory
            size = texpr(v.attrs["size"])
            return [
                f"{n} = {a[0]}.to(tl.int64)",
                f"{n} = tl.where({n} < 0, {n} + {size}, {n})",
                f"{n} = tl.where(({n} >= 0) & ({n} < {size}), {n}, 0)",
            ]
        if op in ("rand", "randn"):
            fn = "uniform" if op == "rand" else "randn"
            return [f"{n} = kt.{fn}({a[0]}, {a[1]})"]
        return [f"{n} = {self._elementwise(v)}"]

    def _load(self, v: Value) -> str:
        index, mask_v = v.attrs["index"], v.attrs["mask"]
        buffer = self.pointer[v.attrs["buffer"]]
        have = self._index_groups(index)
        need = set(have) | (self._value_groups(mask_v) if mask_v is not None else set())
        mask = self._mask(have, mask_v)
        order = [g for g in ("y", "x", "r") if g in need]
        ptr = self._pointer(buffer, index, have, order)
        line = f"tl.load({ptr})" if mask is None else f"tl.load({ptr}, {mask}, other=0)"
        if self.space.tiling.kind == "reduction" and "r" in have and "x" not in have:
            # the same row for every program (a norm's weight): keep it in L2
            line = line[:-1] + ", eviction_policy='evict_last')"
        if v.dtype in LOW_PRECISION:
            line += ".to(tl.float32)"
        return line

    def _cast(self, x: Value, dtype: torch.dtype) -> str:
        if x.dtype == dtype or (x.dtype in LOW_PRECISION and dtype.is_floating_point):
            return x.name
        return convert(x.name, x.dtype, dtype)

    def _elementwise(self, v: Value) -> str:
        operand = result_dtype("add", *(x.dtype for x in v.args))
        fn = ops_table.table(operand, len(v.args)).get(v.op)
        if fn is None:
            raise TritonCodegenError(f"kiln-triton does not render {v.op} on {operand} yet")
        return fn(*(self._cast(x, operand) for x in v.args))

    # -- stores --------------------------------------------------------------------------------
    def store_lines(self, s: Store, guard: str | None = None) -> list[str]:
        """The store ``s``; ``guard``: a condition the program must meet to store at all."""
        full = self._level(s.inner)
        ptr = self._pointer(self.pointer[s.buffer], s.index, self._index_groups(s.index), full)
        mask = self._mask(full)
        if guard is not None:
            mask = guard if mask is None else f"{mask} & ({guard})"
        dtype = self.rec.buffer_dtype(s.buffer)
        value = self._cast(s.value, dtype) if dtype not in LOW_PRECISION else s.value.name
        if (
            s.value.dtype != dtype
            and dtype in LOW_PRECISION
            and not s.value.dtype.is_floating_point
        ):
            value = convert(value, s.value.dtype, torch.float32)
        if s.accumulate:
            return [f"tl.atomic_add({ptr}, {value}, {mask}, sem='relaxed')"]
        return [f"tl.store({ptr}, {value}, {mask})"]

    # -- whole functions -----------------------------------------------------------------------
    def _var_defs(self, index: str, ranges, variables) -> list[str]:
        lines = []
        n = len(ranges)
        for d, v in enumerate(variables):
            inner = math.prod(ranges[d + 1 :]) if d + 1 < n else 1
            expr = index if inner == 1 else f"({index} // {texpr(sympy.expand(inner))})"
            if d > 0:
                expr = f"({expr} % {texpr(ranges[d])})"
            lines.append(f"{v} = {expr}")
        return lines

    def _signature(self, name: str, numels: list[str], blocks: list[str]) -> str:
        params = [self.pointer[a] for a in self.kernel.args]
        params += [str(s) for s in self.kernel.size_args] + numels
        params += [f"{b}: tl.constexpr" for b in blocks] + ["INDEX64: tl.constexpr"]
        return f"@kt.jit_later\ndef {name}({', '.join(params)}):"

    def _pid_lines(self) -> list[str]:
        return [
            "pid = tl.program_id(0)",
            "if INDEX64:",
            "    pid = pid.to(tl.int64)",
        ]

    def _straight_body(self, reduction_lines=None, scan_lines=None) -> list[str]:
        """Every value and store in program order (pointwise, persistent and scan
        kernels)."""
        lines: list[str] = []
        done: dict = {}
        stores = sorted(self.rec.stores, key=lambda s: s.after)
        si = 0
        for idx, v in enumerate(self.rec.values):
            while si < len(stores) and stores[si].after <= idx:
                lines += self.store_lines(stores[si])
                si += 1
            if v.op == "reduction":
                lines += reduction_lines(v, done)
            elif v.op == "scan":
                lines += scan_lines(v)
            else:
                lines += self.value_lines(v)
        for s in stores[si:]:
            lines += self.store_lines(s)
        return lines

    def pointwise_function(self) -> list[str]:
        t, xs = self.space.tiling, self.space.xvars
        if t.kind == "pointwise":
            head = [self._signature(self.name, ["xnumel"], ["XBLOCK"])]
            body = self._pid_lines() + [
                "xindex = pid * XBLOCK + tl.arange(0, XBLOCK)",
                "xmask = xindex < xnumel",
            ]
            body += self._var_defs("xindex", t.ranges, xs)
        else:
            head = [self._signature(self.name, ["ynumel", "xnumel"], ["YBLOCK", "XBLOCK"])]
            body = self._pid_lines() + [
                "xblocks = tl.cdiv(xnumel, XBLOCK)",
                "yindex = (pid // xblocks) * YBLOCK + tl.arange(0, YBLOCK)[:, None]",
                "xindex = (pid % xblocks) * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
                "ymask = yindex < ynumel",
                "xmask = xindex < xnumel",
            ]
            body += self._var_defs("yindex", t.ranges[: t.split], xs[: t.split])
            body += self._var_defs("xindex", t.ranges[t.split :], xs[t.split :])
        body += self._straight_body(self.single_point_reduction)
        return head + ["    " + line for line in body]

    def _reduction_head(
        self, suffix: str, *, split: bool = False, finish: bool = False
    ) -> tuple[list[str], list[str]]:
        """The signature and first lines of a reduction variant. ``split``: programs
        ``split * xblocks + pid`` each reduce chunk ``split`` of the reduction for output
        block ``pid``; ``finish``: the same programs for a kernel whose second loop runs
        after the reduction (:meth:`split_epilogue`), else one per output block, with no
        loop (see :mod:`kiln_triton.split`)."""
        t = self.space.tiling
        numels, blocks = ["xnumel", "rnumel"], ["XBLOCK", "RBLOCK"]
        if split:
            numels += ["ws_ptr", "rsplit"]
        if finish:
            numels += ["ws_ptr", "nsplit", "rsplit"]
            blocks = ["XBLOCK", "SPLIT_BLOCK", "RBLOCK"]
        head = [self._signature(f"{self.name}_{suffix}", numels, blocks)]
        body = self._pid_lines()
        if split or finish:  # a finish without an epilogue runs one program per block
            body += [
                "xblocks = tl.cdiv(xnumel, XBLOCK)",
                "split = pid // xblocks",
                "pid = pid % xblocks",
            ]
        if split:
            body.append("nsplit = tl.num_programs(0) // xblocks")
        body += [
            "xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
            "xmask = xindex < xnumel",
        ]
        if not finish or self.split_epilogue():
            body += [
                "rbase = tl.arange(0, RBLOCK)[None, :]",
                "if INDEX64:",
                "    rbase = rbase.to(tl.int64)",
            ]
        body += self._var_defs("xindex", t.ranges, self.space.xvars)
        return head, body

    def _rdefs(self) -> list[str]:
        t = self.space.tiling
        return ["rmask = rindex < rnumel", "rxmask = rmask & xmask"] + self._var_defs(
            "rindex", t.reduction_ranges, self.space.rvars
        )

    def persistent_function(self) -> list[str]:
        head, body = self._reduction_head("persistent")
        body += ["rindex = rbase"] + self._rdefs()
        body += self._straight_body(self.persistent_reduction)
        return head + ["    " + line for line in body]

    def split_epilogue(self) -> bool:
        """Whether the split variant's second launch runs a loop after the reduction (see
        :func:`kiln_triton.split.has_epilogue`)."""
        return has_epilogue(self)

    def loop_plan(self) -> LoopPlan:
        """Where each value and store of the looped variant goes: loop ``k`` (odd position
        ``2k-1``) or the segment after it (even position ``2k``). Worked out once."""
        if self._loop_plan is None:
            self._loop_plan = self._make_loop_plan()
        return self._loop_plan

    def _make_loop_plan(self) -> LoopPlan:
        values, stores = self.rec.values, self.rec.stores
        loop: dict[str, int] = {}  # inner value -> the loop it is first computable in
        after: dict[str, int] = {}  # outer value -> the loops it waits for
        position: dict[str, int] = {}  # 2k: segment after loop k, 2k-1: loop k

        def need(a: Value) -> int:
            return loop[a.name] if a.inner else after[a.name] + 1

        for v in values:
            if v.op == "reduction":
                after[v.name] = need(v.args[0])
                position[v.name] = 2 * after[v.name]
            elif v.inner:
                loop[v.name] = max([1] + [need(a) for a in v.args])
                position[v.name] = 2 * loop[v.name] - 1
            else:
                after[v.name] = max([0] + [after[a.name] for a in v.args])
                position[v.name] = 2 * after[v.name]
        store_pos = []
        for s in stores:
            deps = [s.value, *s.deps]
            if s.inner:
                req = 2 * max(need(d) if not d.inner else loop[d.name] for d in deps) - 1
                if not s.value.inner and not any(d.inner for d in s.deps):
                    req = 2 * max(after[d.name] + 1 for d in deps) - 1
            else:
                req = 2 * max(after[d.name] for d in deps)
            # never store before an access recorded earlier (in-place buffers)
            running = max([0] + [position[v.name] for v in values[: s.after]])
            pos = max(req, running)
            if (pos % 2 == 1) != s.inner:
                pos += 1
            store_pos.append(pos)
        nloops = max([0] + [(p + 1) // 2 for p in store_pos if p % 2] +
                     [after[v.name] for v in values if v.op == "reduction"])  # fmt: skip
        return LoopPlan(position, store_pos, loop, need, nloops)

    def segment(
        self, plan: LoopPlan, k: int, finals: dict[str, list[str]], guard: str | None = None
    ) -> list[str]:
        """The outer values and stores that wait for loop ``k`` (0: before the first);
        ``guard``: the condition on the program under which its stores are made."""
        values, stores = self.rec.values, self.rec.stores
        items = [
            (i, v) for i, v in enumerate(values) if not v.inner and plan.position[v.name] == 2 * k
        ]
        pairs = zip(stores, plan.store_pos, strict=True)
        items += [(s.after - 0.5, s) for s, p in pairs if p == 2 * k]
        lines: list[str] = []
        for _, item in sorted(items, key=lambda it: it[0]):
            if isinstance(item, Store):
                lines += self.store_lines(item, guard)
            elif item.op == "reduction":
                lines += finals.pop(item.name)
            else:
                lines += self.value_lines(item)
        return lines

    def looped_function(self) -> list[str]:
        head, body = self._reduction_head("looped")
        plan = self.loop_plan()
        values, stores = self.rec.values, self.rec.stores
        done: dict = {}
        finals: dict[str, list[str]] = {}
        for k in range(plan.nloops + 1):
            body += self.segment(plan, k, finals)
            if k == plan.nloops:
                break
            body += self._loop(
                k + 1, values, stores, plan.store_pos, plan.loop, plan.need, done, finals
            )
        return head + ["    " + line for line in body]

    def _loop(
        self, k, values, stores, store_pos, loop, need, done, finals,
        span: str = "range(0, rnumel, RBLOCK)",
    ) -> list[str]:  # fmt: skip
        """Loop ``k`` over ``span`` (the whole reduction, or a split program's chunk)."""
        reductions = [v for v in values if v.op == "reduction" and need(v.args[0]) == k]
        loop_stores = [s for s, p in zip(stores, store_pos, strict=True) if p == 2 * k - 1]
        wanted: set[str] = set()

        def want(v: Value) -> None:
            if not v.inner or v.name in wanted:
                return
            wanted.add(v.name)
            for a in v.args:
                want(a)

        for r in reductions:
            want(r.args[0])
        for s in loop_stores:
            want(s.value)
            for d in s.deps:
                want(d)
        before, update = [], []
        for r in reductions:
            b, u, f = self.looped_reduction(r, done)
            before += b
            update += u
            finals[r.name] = f
        inner = ["rindex = roffset + rbase"] + self._rdefs()
        items = [(i, v) for i, v in enumerate(values) if v.name in wanted]
        items += [(s.after - 0.5, s) for s in loop_stores]
        for _, item in sorted(items, key=lambda it: it[0]):
            inner += self.store_lines(item) if isinstance(item, Store) else self.value_lines(item)
        inner += update
        return before + [f"for roffset in {span}:"] + ["    " + x for x in inner]

    # -- the module ----------------------------------------------------------------------------
    def block_counts(self) -> dict[str, sympy.Expr]:
        """The sizes the launch divides into blocks (``ynumel`` of a tiled kernel,
        ``xnumel``, ``rnumel`` of a reduction), in the order the kernel takes them."""
        t = self.space.tiling
        numels: dict[str, sympy.Expr] = {}
        if t.kind == "tiled":
            numels["ynumel"] = sympy.expand(math.prod(t.ranges[: t.split]))
            numels["xnumel"] = sympy.expand(math.prod(t.ranges[t.split :]))
        else:
            numels["xnumel"] = sympy.expand(math.prod(t.ranges))
        if t.kind == "reduction":
            numels["rnumel"] = sympy.expand(math.prod(t.reduction_ranges))
        return numels

    def meta(self, split_count: int = 0) -> dict:
        """The launcher's metadata; ``split_count``: the split variant's workspace parts."""
        t = self.space.tiling
        counts = self.block_counts()
        numels = {name: py_expr(n) for name, n in counts.items()}
        loads = [v.attrs["index"] for v in self.rec.values if v.op == "load"]
        stored = [s.buffer for s in self.rec.stores]
        return {
            "name": self.name,
            "kind": t.kind,
            "split_parts": split_count,
            # the split variant's second launch also walks the reduction in chunks
            "split_epilogue": bool(split_count) and self.split_epilogue(),
            # the arguments by their pointers' names, not the graph's buffers: equal kernels of
            # different layers or graphs stay one source (see source_hash)
            "args": [self.pointer[a] for a in self.kernel.args],
            # what a compile ahead of the first launch passes for each argument
            "dtypes": [
                str(self.rec.buffer_dtype(a)).removeprefix("torch.") for a in self.kernel.args
            ],
            "sizes": [str(s) for s in self.kernel.size_args],
            "stored": [self.pointer[a] for a in self.kernel.args if a in stored],
            "numels": numels,
            # block counts Triton may specialize: the same at every size (see variants)
            "fixed_specialization": [n for n, e in counts.items() if fixed_specialization(e)],
            "column_major": t.kind == "reduction"
            and column_major(self.space.rvars, self.space.xvars, loads),
        }

    def source(self) -> str:
        out = [f"# {self.kernel.header()}", HEADER]
        parts: list[tuple[str, str]] = []
        if self.kernel.has_scan():
            out += self.scan_function("persistent") + ["", ""] + self.scan_function("looped")
        elif self.space.tiling.kind == "reduction":
            out += self.persistent_function() + ["", ""] + self.looped_function()
            parts = split_parts(self)
            if parts:
                out += ["", ""] + split_function(self, parts)
                out += ["", ""] + finish_function(self, parts)
        else:
            out += self.pointwise_function()
        out += ["", "", f"META = {self.meta(len(parts))!r}"]
        return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=4096)
def merged_space(ranges: tuple, reduction_ranges: tuple, indexed: tuple, stores: tuple) -> tuple:
    """A kernel's dimensions merged where every index walks them as one, and its tiling:
    ``(tiling, substitution, x variables, r variables, indices, store indices)``, the
    indices (of ``indexed``, ``(op, index)`` pairs, then of ``stores``) in the merged
    variables. Kept per ranges and indices: the kernels of a model's repeated layers are
    the same, and merging their sympy indices was half of rendering them."""
    xs, rs = index_vars(len(ranges)), reduction_vars(len(reduction_ranges))
    exprs = [index for op, index in indexed if op in ("load", "index")] + list(stores)
    new_ranges, new_xs, xsubs = merge_dims(list(ranges), xs, exprs)
    new_rranges, new_rs, rsubs = merge_dims(list(reduction_ranges), rs, exprs)
    subs = {**xsubs, **rsubs}
    indices = [index for _, index in indexed]
    store_indices = list(stores)
    if subs:
        indices = [sympy.expand(i.subs(subs, simultaneous=True)) for i in indices]
        store_indices = [sympy.expand(i.subs(subs, simultaneous=True)) for i in store_indices]
    loads = [i for (op, _), i in zip(indexed, indices, strict=True) if op == "load"]
    tiling = choose_tiling(new_ranges, new_rranges, new_xs, loads + store_indices)
    items = tuple(subs.items())
    return tiling, items, tuple(new_xs), tuple(new_rs), tuple(indices), tuple(store_indices)


def fixed_specialization(count: sympy.Expr) -> bool:
    """Whether Triton's specialization of a block count (1 or not, a multiple of 16 or
    not) is the same at every size: a number, or a polynomial in the sizes whose every
    coefficient is a multiple of 16 (``64*s0*s1``: always a multiple of 16, never 1)."""
    if count.is_Integer:
        return True
    try:
        coefficients = sympy.Poly(
            sympy.expand(count), *sorted(count.free_symbols, key=str)
        ).coeffs()
    except sympy.PolynomialError:
        return False
    return all(c.is_Integer and c % 16 == 0 for c in coefficients)


def render_kernel(kernel: Kernel) -> str:
    return KernelRenderer(kernel).source()


def block_counts(kernel: Kernel) -> dict[str, sympy.Expr]:
    """``kernel``'s block counts as its source computes them (``META['numels']``), as
    expressions of its size arguments."""
    return KernelRenderer(kernel).block_counts()


def source_hash(source: str) -> str:
    """The hash of a kernel's code: its first line (the IR kernel's name and header) left
    out, so equal kernels of different graphs or layers share one compiled module."""
    body = source.split("\n", 1)[1] if source.startswith("#") else source
    return hashlib.sha256(body.encode()).hexdigest()[:20]


def kernel_label(source: str) -> str:
    """The IR kernel's name, from the source's first line (``# kiln_softmax_3: ranges=...``)."""
    return source[2:].split(":", 1)[0] if source.startswith("# ") else "kernel"
