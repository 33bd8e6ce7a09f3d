"""``verify()`` of the loop IR: the invariants every pass must keep."""

from __future__ import annotations

import sympy

from kiln_loopir.ir import (
    REDUCTION_TYPES,
    SCAN_TYPES,
    Buffer,
    ComputedNode,
    ExternNode,
    IRError,
    LoopGraph,
    Reduction,
    Scan,
    Scatter,
    TensorRef,
)
from kiln_loopir.loops import merged_from


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise IRError(message)


def check_buffer(buf: Buffer, size_names: set[str]) -> None:
    _check(len(buf.size) == len(buf.stride), f"{buf.name}: size and stride differ in rank")
    for e in (*buf.size, *buf.stride):
        if not isinstance(e, sympy.Expr):  # (the message prints e: built only on failure)
            raise IRError(f"{buf.name}: {e!r} is not a sympy expression")
        if e.is_Integer:
            continue
        unknown = {s.name for s in e.free_symbols} - size_names
        _check(not unknown, f"{buf.name}: layout uses unknown symbols {sorted(unknown)}")


def check_ref(ref: TensorRef, defined: dict[str, Buffer], where: str) -> None:
    _check(ref.buffer in defined, f"{where} reads {ref.buffer} before it is defined")
    _check(len(ref.size) == len(ref.stride), f"{where}: view of {ref.buffer} has mixed ranks")
    _check(ref.dtype == defined[ref.buffer].dtype, f"{where}: view of {ref.buffer} changes dtype")


def check_node_body(node: ComputedNode, defined: dict[str, Buffer], size_names: set[str]):
    body = node.body
    if not (
        tuple(body.ranges) == tuple(node.buffer.size)
        or merged_from(body.ranges, node.buffer.size)
        or isinstance(body, Scatter)
    ):
        raise IRError(
            f"{node.name}: ranges {list(body.ranges)} differ from the buffer size "
            f"{list(node.buffer.size)}"
        )
    if isinstance(body, Reduction):
        _check(body.reduction_type in REDUCTION_TYPES, f"{node.name}: unknown reduction type")
    if isinstance(body, Scan):
        _check(body.scan_type in SCAN_TYPES, f"{node.name}: unknown scan type")
        _check(0 <= body.dim < len(body.ranges), f"{node.name}: scan dim {body.dim} out of range")
    handler, value, store = node.traced()
    _check(isinstance(value, str), f"{node.name}: inner_fn returned {value!r}, not an ops value")
    p, r = body.loop_ranges()
    loop_names = {f"x{i}" for i in range(len(p))} | {f"r{i}" for i in range(len(r))}
    allowed = loop_names | size_names | set(handler.indirect)
    loaded, used = _reads_of(handler, store)
    if used <= allowed and all(name in defined for name in loaded):
        return  # else the loop below names what is wrong
    for load in handler.loads:
        _check(load.buffer in defined, f"{node.name} loads {load.buffer} before it is defined")
        unknown = {s.name for s in load.index.free_symbols} - allowed
        _check(not unknown, f"{node.name}: index of {load.buffer} uses {sorted(unknown)}")
    unknown = {s.name for s in store.free_symbols} - allowed
    _check(not unknown, f"{node.name}: store index uses {sorted(unknown)}")


def _reads_of(handler, store: sympy.Expr) -> tuple[set[str], set[str]]:
    """The buffers a traced body loads and the symbol names its indexes use (its loads'
    and its store's), worked out once per trace: every pass verifies the graph again."""
    found = handler.__dict__.get("_reads")
    if found is None:
        used = {s.name for s in store.free_symbols}
        for load in handler.loads:
            used |= {s.name for s in load.index.free_symbols}
        found = handler.__dict__["_reads"] = ({load.buffer for load in handler.loads}, used)
    return found


def verify_graph(graph: LoopGraph) -> None:
    size_names = {s.name for s in graph.size_hints}
    defined: dict[str, Buffer] = {}
    names: set[str] = set()
    for inp in graph.inputs:
        _check(inp.name not in names, f"input name {inp.name} is used twice")
        names.add(inp.name)
        if inp.buffer is not None:
            check_buffer(inp.buffer, size_names)
            defined[inp.buffer.name] = inp.buffer
    for const in graph.constants:
        check_buffer(const.buffer, size_names)
        defined[const.buffer.name] = const.buffer
    for node in graph.nodes:
        if isinstance(node, ExternNode):
            # sizes an extern op decides at run time (nonzero ..., .item()) become known
            # after it
            size_names |= {s.name for s, _ in node.binds}
            for buf in node.outputs:
                if buf is not None:
                    size_names |= {s.name for e in buf.size for s in e.free_symbols}
        if isinstance(node, ComputedNode):
            check_buffer(node.buffer, size_names)
            if isinstance(node.body, Scatter):
                _check(
                    defined.get(node.name) is node.buffer,
                    f"scatter into {node.name}, which no earlier node wrote",
                )
            else:
                _check(node.name not in defined, f"buffer {node.name} is written twice")
            check_node_body(node, defined, size_names)
            defined[node.name] = node.buffer
        elif isinstance(node, ExternNode):
            for ref in node.input_refs():
                check_ref(ref, defined, f"extern {node.target_name()}")
            _check(
                any(b is not None for b in node.outputs) or bool(node.binds),
                "extern node with no output",
            )
            for buf in node.outputs:
                if buf is not None:
                    check_buffer(buf, size_names)
                    _check(buf.name not in defined, f"buffer {buf.name} is written twice")
                    defined[buf.name] = buf
        else:
            raise IRError(f"unknown node kind {type(node).__name__}")
    for out in graph.outputs:
        if isinstance(out, TensorRef):
            check_ref(out, defined, "the graph output")


def verify_schedule(schedule) -> None:
    """Every node scheduled once, steps in dependency order, kernels well formed."""
    from kiln_loopir.kernel import Kernel
    from kiln_loopir.scheduler import step_symbols_used

    graph = schedule.graph
    verify_graph(graph)
    available = {i.buffer.name for i in graph.inputs if i.buffer is not None}
    available |= {c.buffer.name for c in graph.constants}
    written: dict[str, int] = {}
    scheduled: list[object] = []
    readers_outside: dict[str, int] = {}
    bound: set = set()  # data-dependent symbols bound by the steps so far
    for step in schedule.steps:
        unbound = sorted(map(str, step_symbols_used(step) - bound))
        _check(not unbound, f"{step.name} uses {unbound} before the step that binds them")
        if not isinstance(step, Kernel):
            bound |= step.bound_symbols()
        if isinstance(step, Kernel):
            _check(bool(step.nodes), f"{step.name} has no nodes")
            levels = step.levels()
            _check(None not in levels, f"{step.name}: a node does not fit its iteration space")
            _check(step.same_point_reads(), f"{step.name}: a fused read is not at its store point")
            devices = {n.buffer.device for n in step.nodes}
            _check(len(devices) == 1, f"{step.name} spans devices {devices}")
            for name in step.reads():
                _check(name in available, f"{step.name} reads {name} before it is written")
                readers_outside[name] = readers_outside.get(name, 0) + 1
            for node in step.nodes:
                scheduled.append(node)
                written[node.name] = written.get(node.name, 0) + 1
            available |= step.writes()
        else:
            for ref in step.input_refs():
                _check(ref.buffer in available, f"extern reads {ref.buffer} before it is written")
                readers_outside[ref.buffer] = readers_outside.get(ref.buffer, 0) + 1
            scheduled.append(step)
            available |= {b.name for b in step.outputs if b is not None}
    _check(
        len(scheduled) == len(graph.nodes) and set(map(id, scheduled)) == set(map(id, graph.nodes)),
        "the schedule does not hold every node of the graph exactly once",
    )
    outputs = {o.buffer for o in graph.outputs if isinstance(o, TensorRef)}
    for step in schedule.steps:
        if isinstance(step, Kernel):
            for name in step.local_buffers:
                _check(name not in outputs, f"{step.name} keeps output {name} local")
                _check(
                    name not in readers_outside,
                    f"{step.name} keeps {name} local but it is read elsewhere",
                )
