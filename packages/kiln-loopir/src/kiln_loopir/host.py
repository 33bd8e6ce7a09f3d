"""The host program: generated Python that checks inputs, binds sizes, allocates buffers,
launches kernels and extern ops, frees dead buffers and returns the outputs with the
strides eager gives them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy
import torch

from kiln_loopir.ir import Buffer, ExternNode, LoopGraph, TensorRef
from kiln_loopir.kernel import Kernel, Schedule
from kiln_loopir.launch import LaunchGroup
from kiln_loopir.memory import MemoryPlan
from kiln_loopir.runtime import view_layout
from kiln_loopir.scheduler import schedule_reads
from kiln_loopir.symbols import py_expr


class HostNotRendered(Exception):
    """A graph a code generator's native host program does not cover: the Python host
    program runs it (see ``Codegen.render_host``)."""


def _tuple(exprs) -> str:
    items = [py_expr(e) for e in exprs]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def size_sources(graph: LoopGraph) -> list[tuple[sympy.Symbol, str, str | None, int]]:
    """Where each size symbol is first read from the inputs: ``(symbol, input, "size" or
    "stride", dim)``, or ``(symbol, input, None, 0)`` for an input that is the number."""
    found: dict[sympy.Symbol, tuple] = {}
    for inp in graph.inputs:
        if inp.buffer is not None:
            for attr, exprs in (("size", inp.buffer.size), ("stride", inp.buffer.stride)):
                for d, e in enumerate(exprs):
                    if isinstance(e, sympy.Symbol) and e not in found:
                        found[e] = (e, inp.name, attr, d)
        elif isinstance(inp.expr, sympy.Symbol) and inp.expr not in found:
            found[inp.expr] = (inp.expr, inp.name, None, 0)
    return list(found.values())


def size_bindings(graph: LoopGraph) -> list[str]:
    """Lines binding each size symbol from the inputs (``s0 = arg0_1.size(0)``)."""
    sources = size_sources(graph)
    lines = [
        f"{sym} = {name}.{attr}({d})" if attr else f"{sym} = {name}"
        for sym, name, attr, d in sources
    ]
    bound = {sym for sym, *_ in sources}
    used: set[sympy.Symbol] = set()
    for buf in graph.buffers().values():
        for e in (*buf.size, *buf.stride):
            used |= e.free_symbols
    refs = [o for o in graph.outputs if isinstance(o, TensorRef)]
    refs += [r for n in graph.nodes if isinstance(n, ExternNode) for r in n.input_refs()]
    for ref in refs:
        for e in (*ref.size, *ref.stride, ref.offset):
            used |= sympy.sympify(e).free_symbols
    # sizes only an extern op's result tells (nonzero ..., .item()) are bound after that op
    for node in graph.nodes:
        if isinstance(node, ExternNode):
            used -= {s for s, _ in node.binds}
            for buf in node.outputs:
                if buf is not None:
                    used -= {s for e in buf.size for s in e.free_symbols}
    missing = sorted(str(s) for s in used - bound)
    if missing:
        raise NotImplementedError(
            f"sizes {missing} are not an input's size, stride or SymInt, nor the size of an "
            "extern op's result (they come from tensor data, e.g. .item()): the host program "
            "cannot bind them; make them graph inputs or break the graph before them"
        )
    return lines


def format_value(a: object, buffers: dict[str, Buffer]) -> str:
    """A value of an extern call or an output, as host-program Python."""
    if isinstance(a, TensorRef):
        buf = buffers[a.buffer]
        if a.is_whole(buf):
            return a.buffer
        return view_source(a.buffer, a.size, a.stride, a.offset)
    if isinstance(a, sympy.Expr):
        return py_expr(a)
    if isinstance(a, list):
        return "[" + ", ".join(format_value(x, buffers) for x in a) + "]"
    if isinstance(a, tuple):
        inner = ", ".join(format_value(x, buffers) for x in a)
        return f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, torch._ops.OpOverload) and a.namespace == "aten":
        return str(a)  # a view op view_layout applies
    if isinstance(a, torch.device):
        return f"torch.device({str(a)!r})"
    if isinstance(a, (torch.layout, torch.memory_format)):
        return str(a)
    if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
        return f"float({str(a)!r})"
    return repr(a)


def view_source(base: str, size, stride, offset) -> str:
    """A view of ``base``'s storage; ``as_strided`` keeps ``base``'s own storage offset."""
    if offset == 0:
        return f"as_strided({base}, {_tuple(size)}, {_tuple(stride)})"
    return f"reinterpret({base}, {_tuple(size)}, {_tuple(stride)}, {py_expr(offset)})"


def _target(node: ExternNode) -> str:
    if isinstance(node.target, torch._ops.OpOverload):
        return extern_name(node.target)
    if node.target is view_layout:
        return node.target.__name__
    raise NotImplementedError(f"extern target {node.target!r} has no host-program name")


def extern_name(op: torch._ops.OpOverload) -> str:
    """The host program's name for an extern op: ``aten_addmm_default``, bound once when the
    program loads (see :func:`extern_bindings`), so a call costs no attribute lookups."""
    namespace, name = op.namespace, op._schema.name.split("::")[-1]
    return f"{namespace}_{name}_{op._overloadname}"


def extern_bindings(schedule: Schedule, own: Mapping[int, str] | None = None) -> list[str]:
    """``aten_addmm_default = bind_op(aten.addmm.default)`` for each extern op the program
    calls: the op's compiled entry point, looked up once. A step the code generator computes
    with a kernel of its own (``own``: step index -> name) is bound by that name to
    ``own_kernel(name, op)``: that kernel, where the program was loaded with it, else the
    op."""
    own = own or {}
    ops: dict[str, str] = {}
    for i, step in enumerate(schedule.steps):
        if isinstance(step, ExternNode) and isinstance(step.target, torch._ops.OpOverload):
            op = step.target
            path = str(op) if op.namespace == "aten" else f"torch.ops.{op}"
            if i in own:
                ops[own[i]] = f"own_kernel({own[i]!r}, {path})"
            else:
                ops.setdefault(extern_name(op), f"bind_op({path})")
    return [f"{name} = {binding}" for name, binding in ops.items()]


def _is_static(buffer: Buffer) -> bool:
    return not any(sympy.sympify(e).free_symbols for e in (*buffer.size, *buffer.stride))


def _input_check(k: int, inp) -> str:
    return (
        f"assert_size_stride({inp.name}, {_tuple(inp.buffer.size)}, "
        f"{_tuple(inp.buffer.stride)}, {f'input {k} ({inp.name})'!r})"
    )


def generate_host(
    schedule: Schedule,
    plan: MemoryPlan,
    groups: Sequence[LaunchGroup] = (),
    own: Mapping[int, str] | None = None,
) -> str:
    """The host program for ``schedule``: the source of ``call(*inputs)`` and
    ``check(*inputs)``; the extern steps of ``own`` (step index -> name) call the code
    generator's kernel of that name in place of their op (see :func:`extern_bindings`).

    ``call`` runs the graph. It checks the layout of inputs whose sizes are symbols (the
    sizes it binds come from them); ``check`` checks the inputs whose sizes and strides are
    numbers, and is what a caller that does not guard its inputs runs first. Extern ops are
    bound to names once, above the functions.
    """
    graph = schedule.graph
    own = own or {}
    names = ", ".join(i.name for i in graph.inputs)
    static = [(k, i) for k, i in enumerate(graph.inputs) if i.buffer and _is_static(i.buffer)]
    checks = [_input_check(k, inp) for k, inp in static] or ["pass"]
    body = size_bindings(graph)
    body += [
        _input_check(k, inp)
        for k, inp in enumerate(graph.inputs)
        if inp.buffer is not None and not _is_static(inp.buffer)
    ]
    bound_after = {line.split(" = ")[0] for line in body}
    body += _steps(schedule, plan, groups, bound_after, own)
    header = extern_bindings(schedule, own)
    sections = [
        "\n".join(header) + "\n\n\n" if header else "",
        _function(f"call({names})", body),
        "\n\n",
        _function(f"check({names})", checks),
    ]
    return "".join(sections)


def _function(signature: str, body: list[str]) -> str:
    return "\n".join([f"def {signature}:"] + ["    " + line for line in body]) + "\n"


def _steps(
    schedule: Schedule,
    plan: MemoryPlan,
    groups: Sequence[LaunchGroup],
    bound_after: set[str],
    own: Mapping[int, str],
) -> list[str]:
    """Allocations, launches, extern calls and frees, step by step, then the return."""
    graph = schedule.graph
    buffers = graph.buffers()
    body: list[str] = []
    group_of = {id(k): g for g in groups for k in g.kernels}
    deferred: list[str] = []  # names a group's kernels still read: dropped after its call
    reused = {old for p in plan.steps for old in p.reuse.values()}
    read = schedule_reads(schedule)
    for i, (step, sp) in enumerate(zip(schedule.steps, plan.steps, strict=True)):
        for name in sp.allocate:
            b = buffers[name]
            body.append(
                f"{name} = empty_strided({_tuple(b.size)}, {_tuple(b.stride)}, {b.dtype}, "
                f"{str(b.device)!r})"
            )
        group = group_of.get(id(step))
        for new, old in {**sp.reuse, **sp.in_place}.items():
            b, o = buffers[new], buffers[old]
            # a kernel working in place still reads the old name: drop it after the launch
            drop = f"; del {old}  # reuse" if new in sp.reuse else "  # in place"
            if group is not None and new in sp.reuse:
                drop = "  # reuse"
                deferred.append(old)
            if tuple(b.size) == tuple(o.size) and tuple(b.stride) == tuple(o.stride):
                body.append(f"{new} = {old}{drop}")
            else:
                body.append(f"{new} = {view_source(old, b.size, b.stride, 0)}{drop}")
        if group is not None:
            deferred += [n for n in sp.free if n not in reused] + list(sp.in_place.values())
            if step is group.kernels[-1]:
                args = list(group.args) + [str(s) for s in group.size_args]
                body.append(f"{group.name}({', '.join(args)})")
                if deferred:
                    body.append("del " + ", ".join(dict.fromkeys(deferred)))
                deferred = []
            continue
        if isinstance(step, Kernel):
            args = list(step.args) + [str(s) for s in step.size_args]
            body.append(f"{step.name}({', '.join(args)})")
        else:
            call_args = [format_value(a, buffers) for a in step.args]
            call_args += [f"{k}={format_value(v, buffers)}" for k, v in step.kwargs.items()]
            call = f"{own.get(i) or _target(step)}({', '.join(call_args)})"
            if step.binds:  # a number read from tensor data, or the size of a view
                body += _bind_symbols(step.binds, call)
                bound_after |= {str(sym) for sym, _ in step.binds}
                continue
            outs = [b.name if b is not None else "_" for b in step.outputs]
            lhs = ", ".join(outs) + ("," if step.tuple_output and len(outs) == 1 else "")
            body.append(f"{lhs} = {call}")
            for b in step.outputs:
                for d, e in enumerate(b.size if b is not None else ()):
                    if isinstance(e, sympy.Symbol) and str(e) not in bound_after:
                        body.append(f"{e} = {b.name}.size({d})")
                        bound_after.add(str(e))
            for b in step.outputs:
                # an output nothing reads is not checked: some ATen kernels leave one
                # empty (embedding_bag's offset2bag in bfloat16)
                if b is not None and b.name in read:
                    body.append(
                        f"{b.name} = match_layout({b.name}, {_tuple(b.size)}, "
                        f"{_tuple(b.stride)}, {f'{step.target_name()} output {b.name}'!r})"
                    )
        freed = [n for n in sp.free if n not in reused] + list(sp.in_place.values())
        if freed:
            body.append("del " + ", ".join(freed))
    outs = [format_value(o, buffers) for o in graph.outputs]
    body.append("return (" + ", ".join(outs) + ("," if len(outs) == 1 else "") + ")")
    return body


def _bind_symbols(binds: list[tuple[sympy.Symbol, str]], call: str) -> list[str]:
    """``u0 = call`` for one symbol that is the whole result, else the result in a
    temporary and each symbol taken from it."""
    if len(binds) == 1 and binds[0][1] == "":
        return [f"{binds[0][0]} = {call}"]
    return [f"bound = {call}"] + [f"{sym} = bound{path}" for sym, path in binds] + ["del bound"]


def kernel_launch_args(schedule: Schedule) -> None:
    """Fill each kernel's ``args`` (loaded, then stored buffers), their ``arg_dtypes``
    and ``size_args``."""
    buffers = schedule.graph.buffers()
    known = schedule.graph.size_symbols()
    for kernel in schedule.kernels():
        reads = sorted(kernel.reads())
        stored = kernel.stored_buffers()
        kernel.args = reads + [s for s in stored if s not in reads]
        kernel.arg_dtypes = {a: buffers[a].dtype for a in kernel.args}
        symbols: set[sympy.Symbol] = set(kernel.symbols())
        for e in (*kernel.ranges, *kernel.reduction_ranges):
            symbols |= sympy.sympify(e).free_symbols
        symbols = {s for s in symbols if s.name in known}
        kernel.size_args = sorted(symbols, key=str)
