"""Capturing one call of a function: trace its bytecode, compile the graph, emit the code.

``convert_frame`` is the whole pipeline for one cache miss, top to bottom:

1. bind the call's arguments to the frame's locals (wrapped lazily, with their sources);
2. trace the bytecode with a root translator until the frame returns, or until the
   instruction that breaks the graph (found on a first pass, then traced again to stop
   cleanly before it);
3. choose the graph's outputs (graph values the generated code needs) and hand the FX
   graph to the backend;
4. emit the transformed code: call the compiled graph, replay side effects, then either
   return the rebuilt value or run the breaking instruction natively and call the resume
   function;
5. build the guard function from the guards the trace recorded.
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx

from kiln_capture import distributed, versions
from kiln_capture.codegen import Codegen, function_over
from kiln_capture.comprehensions import (
    comprehension_at,
    comprehension_function,
    enclosing_comprehension,
)
from kiln_capture.dynamic_shapes import DynamicSizes, without_unread_offsets
from kiln_capture.exc import CaptureFailed, GraphBreak, RestartAnalysis, Unsupported
from kiln_capture.guards import GuardFunction, build_guard_function
from kiln_capture.kept_captures import keepable_parts
from kiln_capture.loop_breaks import emit_native_step, guard_native_steps
from kiln_capture.native_calls import (
    ConstantValue,
    emit_native_call,
    is_null,
    nulls,
    reconstruct_values,
)
from kiln_capture.opcodes.control import ContextExit, loop_exit
from kiln_capture.output_graph import OutputGraph
from kiln_capture.program import load_program, source_line
from kiln_capture.sources import ClosureSource, LocalSource, PassedCellSource
from kiln_capture.translator import Translator
from kiln_capture.variables.base import DeletedVariable, Variable
from kiln_capture.variables.builder import wrap
from kiln_capture.variables.class_statements import refuse_escaping_class
from kiln_capture.variables.context_managers import GeneratorContextManagerVariable
from kiln_capture.variables.torch_calls import AutocastVariable

log = logging.getLogger("kiln.capture")

CALL_OPS = ("CALL", "CALL_KW", "CALL_FUNCTION_EX")
JUMP_OPS = (
    "POP_JUMP_IF_TRUE",
    "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE",
    "POP_JUMP_FORWARD_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_FALSE",
    "POP_JUMP_IF_NONE",
    "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_FORWARD_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE",
)


# Instructions that cannot be replayed alone: they jump, return, or need the frame's blocks.
NATIVE_OK_EXCLUDED = (
    "RETURN_VALUE",
    "RETURN_CONST",
    "YIELD_VALUE",
    "SEND",
    "RAISE_VARARGS",
    "RERAISE",
    "JUMP_FORWARD",
    "JUMP_BACKWARD",
    "JUMP_IF_TRUE_OR_POP",
    "JUMP_IF_FALSE_OR_POP",
    "PUSH_EXC_INFO",
    "POP_EXCEPT",
    "LOAD_FAST",
    "STORE_FAST",
    "DELETE_FAST",
    "LOAD_DEREF",
    "STORE_DEREF",
    "LOAD_CLOSURE",
    "MAKE_CELL",
    "KW_NAMES",
    "PRECALL",
)


def copy_instr(inst):
    from bytecode import Instr

    return (
        Instr(inst.name, inst.arg, location=inst.location)
        if inst.require_arg()
        else Instr(inst.name, location=inst.location)
    )


@dataclass
class GraphBreakRecord:
    reason: str
    where: str
    data_dependent: bool = False  # an output size or a Python value depends on tensor data


@dataclass
class CaptureResult:
    """What one cache miss produced."""

    # makes the transformed function (same signature as the original), on first use of
    # ``function``: where the dispatcher calls the graph itself, nothing ever needs it, and
    # assembling a frame that loads hundreds of parameters costs a tenth of a second
    make_function: Callable[[], types.FunctionType]
    guard: GuardFunction
    graph: torch.fx.GraphModule | None
    graph_break: GraphBreakRecord | None = None
    resumes: list = field(default_factory=list)
    # (compiled graph, input expressions, output index) when the whole frame is "return one
    # output of the graph": the dispatcher calls the graph directly
    direct: tuple | None = None
    # (compiled graph, input expressions, epilogue) for any frame with a graph: the
    # dispatcher calls the graph on the inputs its guards read, then
    # ``epilogue(graph outputs, *arguments)`` (the transformed code after the graph call)
    after_graph: tuple | None = None
    # the graph's inputs in the call that was captured, until :meth:`run_first` uses them
    first_inputs: list | None = field(default=None, repr=False)
    # what keeping the capture for later processes needs beside it (kept_captures), or None
    keep: dict | None = field(default=None, repr=False)
    restored: bool = False  # restored from a kept capture, not traced
    _function: types.FunctionType | None = field(default=None, repr=False)

    @property
    def function(self) -> types.FunctionType:
        """The transformed function."""
        if self._function is None:
            self._function = self.make_function()
        return self._function

    @function.setter
    def function(self, function) -> None:
        self._function = function

    def run_first(self, args, kwargs):
        """The call that was captured, run as the dispatcher runs this entry (the graph on
        the inputs the trace read, then the epilogue) where it calls the graph itself."""
        inputs, self.first_inputs = self.first_inputs, None  # the call's tensors, not kept
        if self.direct is not None and inputs is not None:
            compiled, _, index = self.direct
            return compiled(*inputs)[index]
        if self.after_graph is not None and inputs is not None:
            compiled, _, epilogue = self.after_graph
            return epilogue(compiled(*inputs), *args, **kwargs)
        return self.function(*args, **kwargs)


class LazyLocal(Variable):
    """An argument not looked at yet: wrapped (and guarded) on first use."""

    def __init__(self, value, source):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"argument {self.source.expr()}"


class StopBeforeBreak(Exception):
    pass


class RootTranslator(Translator):
    def __init__(self, *args, break_at: int | None, fullgraph: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.break_at = break_at
        self.fullgraph = fullgraph
        self.returned = False

    def realize_local(self, name, value):
        if isinstance(value, LazyLocal):
            value = wrap(self, value.value, value.source)
            self.locals[name] = value
        return value

    def step(self) -> None:
        if self.ip == self.break_at:
            self.grad_mode_at_stop = torch.is_grad_enabled()
            # autocast regions the trace is inside (its real ones are left when it ends)
            self.autocast_regions_at_stop = len(self.output.live_contexts)
            raise StopBeforeBreak()
        index = self.ip
        try:
            super().step()
        except GraphBreak as brk:
            where = brk.inner_where or source_line(self.program, index)
            if self.fullgraph:
                raise Unsupported(brk.reason, where) from None
            comprehension = enclosing_comprehension(self.program, index)
            if comprehension is not None:  # 3.12+: the comprehension runs as a call
                index = comprehension.start
            raise RestartAnalysis(index, brk.reason, where, brk.data_dependent) from None

    def check_return(self) -> None:
        self.returned = True


def bind_locals(fn, args, kwargs) -> dict:
    signature = inspect.signature(fn, follow_wrapped=False)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return {name: LazyLocal(value, LocalSource(name)) for name, value in bound.arguments.items()}


def root_cells(fn, output, local_vars: dict) -> dict:
    """The frame's cells known before its first instruction: its free variables, and the
    cells a resume function takes as arguments (taken out of ``local_vars``)."""
    from kiln_capture.resume import passed_cells

    cells = {}
    for i, name in enumerate(fn.__code__.co_freevars):
        cells[name] = output.cell_for(fn.__closure__[i], ClosureSource(name, i))
    for name in passed_cells(fn.__code__):
        cells[name] = output.cell_for(local_vars.pop(name).value, PassedCellSource(name))
    return cells


def own_cells(root) -> dict:
    """The frame's cells made in the trace (MAKE_CELL) that hold a value: only the trace
    has that value, the generated code stores it in the frame's real cell."""
    return {
        name: cell
        for name, cell in root.cells.items()
        if cell.real_cell is None and cell.contents is not None and not _unbound(cell.contents)
    }


def cells_reached(roots: list[Variable]) -> set[int]:
    """Ids of the cells that the values in ``roots`` hold (functions' closures)."""
    found, seen = set(), set()

    def visit(v):
        if id(v) in seen:
            return
        seen.add(id(v))
        for cell in getattr(v, "closure", None) or ():
            found.add(id(cell))
        for child in children(v):
            visit(child)

    for root in roots:
        visit(root)
    return found


def store_cells(cg, cells: dict) -> None:
    """Store into the frame's cells the values pushed for them (in ``cells``' order)."""
    for name in reversed(cells):
        cg.store_local(name)


def convert_frame(
    fn,
    args,
    kwargs,
    backend,
    *,
    fullgraph=False,
    dynamic: DynamicSizes | None = None,
    wrap_callee=None,
) -> CaptureResult:
    """Capture one call of ``fn``; see the module docstring for the steps."""
    code = fn.__code__
    if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
        raise CaptureFailed("generators and coroutines run eagerly")
    break_at, break_info = None, None
    for _ in range(3):
        try:
            return trace(
                fn,
                args,
                kwargs,
                backend,
                fullgraph,
                dynamic if dynamic is not None else DynamicSizes(),
                break_at,
                break_info,
                wrap_callee,
            )
        except RestartAnalysis as restart:
            if restart.break_at == break_at:
                raise CaptureFailed(f"graph break at {restart.where} cannot be resumed") from None
            break_at = restart.break_at
            break_info = GraphBreakRecord(restart.reason, restart.where, restart.data_dependent)
            log.info("graph break: %s at %s", restart.reason, restart.where)
    raise CaptureFailed("capture did not settle on a graph break")


def trace(
    fn,
    args,
    kwargs,
    backend,
    fullgraph,
    dynamic,
    break_at,
    break_info,
    wrap_callee,
) -> CaptureResult:
    output = OutputGraph(fn.__globals__, fn.__closure__, dynamic)
    program = load_program(fn.__code__)
    local_vars = bind_locals(fn, args, kwargs)
    root = RootTranslator(
        program,
        output,
        fn.__globals__,
        local_vars,
        root_cells(fn, output, local_vars),
        break_at=break_at,
        fullgraph=fullgraph,
    )
    with output.tracing_state():
        try:
            returned = root.run()
        except StopBeforeBreak:
            returned = None
    if returned is not None:
        return finish_return(fn, output, root, returned, backend)
    return finish_break(fn, output, root, backend, break_info, wrap_callee)


# --- after tracing ----------------------------------------------------------------


def graph_values(roots: list[Variable]) -> list[Variable]:
    """Graph-produced values (tensors, symbolic ints) reachable from ``roots``, in order."""
    from kiln_capture.variables.tensor import SymNodeVariable, TensorVariable

    found, seen = [], set()

    def visit(v):
        if v is None or id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, (TensorVariable, SymNodeVariable)):
            if v.source is None:
                found.append(v)
            return
        for child in children(v):
            visit(child)

    for root in roots:
        visit(root)
    return found


def children(v: Variable) -> list:
    out = []
    for attr in ("items", "parts"):
        value = getattr(v, attr, None)
        if isinstance(value, list):
            out.extend(value)
    entries = getattr(v, "entries", None)
    if isinstance(entries, dict):
        for key, value in entries.values():
            out += [key, value]
    members = getattr(v, "members", None)
    if isinstance(members, dict):
        out.extend(members.values())
    for attr in ("fields", "attrs"):
        mapping = getattr(v, attr, None)
        if isinstance(mapping, dict):
            out.extend(mapping.values())
    closure = getattr(v, "closure", None)
    if isinstance(closure, (list, tuple)):  # a function made in the frame: its cells
        out.extend(closure)
    for attr in ("self_var", "function", "contents", "tensor"):
        value = getattr(v, attr, None)
        if isinstance(value, Variable):
            out.append(value)
    return out


def refuse_escaping_classes(roots: list[Variable]) -> None:
    """Fail before a graph is compiled for nothing where the code after it would hand out
    a class made over stand-in cells (``class_statements.refuse_escaping_class``)."""
    seen = set()

    def visit(v):
        if id(v) in seen:
            return
        seen.add(id(v))
        for attr in ("cls", "value"):
            refuse_escaping_class(getattr(v, attr, None))
        for child in children(v):
            visit(child)

    for root in roots:
        visit(root)


def compile_graph(output: OutputGraph, needed: list[Variable], backend):
    """Finish the FX graph with ``needed`` as its outputs and hand it to the backend."""
    refuse_escaping_classes(needed)
    values = graph_values(needed)
    if not output.has_ops() and not values:
        return None, None, {}
    output.graph.output(tuple(v.node for v in values))
    for node in output.graph.nodes:  # a metadata query whose answer went unused
        if (
            node.op == "call_function"
            and node.target is torch.ops.aten.sym_size.int
            and not node.users
        ):
            output.graph.erase_node(node)
    output.graph.lint()
    gm = torch.fx.GraphModule(torch.nn.Module(), output.graph, class_name="CapturedGraph")
    gm.meta["kiln_input_sources"] = [s.expr() for s, _, _ in output.inputs]
    example_inputs = [value for _, value, _ in output.inputs]
    compiled = distributed.compile_graph(gm, example_inputs, backend)
    if compiled is None:
        raise CaptureFailed("the backend returned None instead of a callable")
    return gm, compiled, {id(v): i for i, v in enumerate(values)}


def finish_return(fn, output, root, returned, backend) -> CaptureResult:
    needed = [returned, *output.side_effects.stored_values()]
    # a function made in the frame and handed out holds the frame's cells: they get the
    # values the trace left in them
    reached = cells_reached(needed)
    cells = {name: c for name, c in own_cells(root).items() if id(c) in reached}
    gm, compiled, indices = compile_graph(output, needed, backend)
    cg = Codegen(fn.__code__, indices)
    cg.frame_cells = {id(cell): name for name, cell in root.cells.items()}
    cg.prologue()
    if compiled is not None:
        cg.call_graph(compiled, [s for s, _, _ in output.inputs])
    for cell in cells.values():
        cg.reconstruct(cell.contents)
    store_cells(cg, cells)
    # values are rebuilt before the side effects are replayed: a replay may empty a
    # container that a value is read from
    cg.reconstruct(returned)
    output.side_effects.replay(cg, fn.__globals__)
    cg.emit_return()
    return CaptureResult(
        functools.partial(make_function, fn, cg),
        build_guard_function(fn, output.guards, shape_guards(output)),
        gm,
        direct=direct_call(output, compiled, indices, returned),
        after_graph=graph_then_epilogue(fn, output, compiled, cg),
        first_inputs=graph_inputs(output, compiled),
        keep=keepable_parts(output, gm),
    )


def autocast_regions_open(root) -> list:
    """The autocast regions the frame opened and is inside at its break, outermost first:
    each ``with`` block's exit on the stack. A region opened otherwise (in a call that was
    inlined) cannot be entered again after the graph: the frame runs eagerly."""
    regions = [
        v.manager
        for v in root.stack
        if isinstance(v, ContextExit) and isinstance(v.manager, AutocastVariable)
    ]
    if len(regions) != root.autocast_regions_at_stop:
        where = source_line(root.program, root.ip)
        raise CaptureFailed(f"graph break inside an autocast region at {where}")
    return regions


def finish_break(fn, output, root, backend, break_info, wrap_callee) -> CaptureResult:
    """Graph up to the break, the breaking instruction natively, then the resume function."""
    index = root.ip
    inst = root.program.instrs[index]
    handler = root.program.handlers[index]
    # found before a graph is compiled for nothing
    if inst.name == "FOR_ITER":  # an iterator capture does not trace: the step runs natively
        guard_native_steps(output, root.stack[-1], break_info.where)
    elif inst.name in NATIVE_OK_EXCLUDED:
        raise CaptureFailed(f"graph break at {inst.name} ({break_info.where}) cannot be resumed")
    from kiln_capture.resume import is_resume_argument

    live = {
        name: v
        for name, v in root.locals.items()
        if not _unbound(v) and not is_resume_argument(name)
    }
    stack = list(root.stack)
    for value in [*stack, *live.values()]:  # a generator's state lives in the trace only
        held = getattr(value, "manager", value)
        if isinstance(held, GeneratorContextManagerVariable) and held.generator is not None:
            held.break_at_with()
    open_regions = autocast_regions_open(root)
    cells = own_cells(root)
    needed = [
        *stack,
        *live.values(),
        *(c.contents for c in cells.values()),
        *output.side_effects.stored_values(),
    ]
    grad_mode_changed = root.grad_mode_at_stop != output.initial_grad_mode
    if grad_mode_changed:  # the graph ends in the mode it started in; the code switches back
        output.graph.call_function(torch._C._set_grad_enabled, (output.initial_grad_mode,))
    for region in reversed(open_regions):  # the code enters each again (its exit's rebuild)
        region.leave_in_graph(root)
    gm, compiled, indices = compile_graph(output, needed, backend)
    cg = Codegen(fn.__code__, indices)
    cg.frame_cells = {id(cell): name for name, cell in root.cells.items()}
    cg.prologue()
    if compiled is not None:
        cg.call_graph(compiled, [s for s, _, _ in output.inputs])
    if grad_mode_changed:
        cg.call_object(torch._C._set_grad_enabled, [ConstantValue(root.grad_mode_at_stop)])
        cg.pop_top()
    # every value is read before any local or cell is stored: a source reads the call's
    # arguments (an argument that is a cell variable is read through its cell)
    for value in [*live.values(), *(c.contents for c in cells.values())]:
        cg.reconstruct(value)
    store_cells(cg, cells)
    for name in reversed(live):
        cg.store_local(name)
    output.side_effects.replay(cg, fn.__globals__)
    local_names = tuple(live)
    from kiln_capture.resume import cell_names

    frame_cell_names = cell_names(fn.__code__)
    resumes = []

    def resume_after(target: int, null_mask: tuple[bool, ...]):
        from kiln_capture.resume import make_resume_function

        resume = wrap_callee(make_resume_function(fn, target, null_mask, local_names))
        resumes.append(resume)
        cg.call_resume(resume, null_mask.count(False), list(local_names), frame_cell_names)

    handler_entry = None
    if handler is not None:
        from bytecode import Label, TryBegin

        handler_entry = TryBegin(Label(), handler.push_lasti, stack_depth=handler.stack_depth)
        if any(is_null(v) for v in stack[: handler.stack_depth]):
            raise CaptureFailed(f"graph break at {break_info.where} cannot be resumed")

    comprehension = comprehension_at(root.program, index)
    if comprehension is not None:
        below = call_comprehension(
            cg, fn, root, comprehension, live, frame_cell_names, wrap_callee, handler_entry
        )
        saved = tuple(_unbound(live.get(name, DeletedVariable())) for name in comprehension.saved)
        resume_after(comprehension.end_for + 1, (*nulls(below), *saved, False))
    elif inst.name in CALL_OPS:
        below = emit_native_call(cg, root, inst, wrap_callee, handler_entry)
        following = root.program.instrs[index + 1]
        if following.name == "POP_TOP":  # the result is unused: drop it here
            cg.pop_top()
            resume_after(index + 2, nulls(below))
        else:
            resume_after(index + 1, (*nulls(below), False))
    elif inst.name in JUMP_OPS:
        below, condition = stack[:-1], stack[-1]
        reconstruct_values(cg, below)
        cg.reconstruct(condition)
        from bytecode import Instr

        other = cg.new_label()
        # the branch target is ahead in the generated code (3.11 names jumps by direction)
        cg.in_handler_region(
            handler_entry, Instr(inst.name.replace("_BACKWARD_", "_FORWARD_"), other)
        )
        resume_after(index + 1, nulls(below))
        cg.emit(other)
        resume_after(root.program.target(inst.arg), nulls(below))
    elif inst.name == "FOR_ITER":
        # one resume function for the body (the item on the iterator) and one for the exit
        below, iterator = stack[:-1], stack[-1]
        reconstruct_values(cg, below)
        cg.reconstruct(iterator)
        emit_native_step(
            cg,
            handler_entry,
            lambda: resume_after(index + 1, (*nulls(below), False, False)),
            lambda: resume_after(loop_exit(root.program, index), nulls(below)),
        )
    else:
        # any other instruction runs as it is, on the rebuilt stack
        native, pushed = native_form(inst)
        popped, _ = native_stack_effect(native)
        below, operands = stack[: len(stack) + popped], stack[len(stack) + popped :]
        if any(is_null(v) for v in operands):
            raise CaptureFailed(
                f"graph break at {inst.name} ({break_info.where}) cannot be resumed"
            )
        reconstruct_values(cg, below)
        for value in operands:
            cg.reconstruct(value)
        cg.in_handler_region(handler_entry, native)
        resume_after(index + 1, (*nulls(below), *pushed))
    if handler_entry is not None:
        # an exception from the native instruction: the original handler, as a resume point
        cg.emit(handler_entry.target)
        depth = handler.stack_depth + handler.push_lasti + 1
        resume_after(handler.target, (False,) * depth)
    return CaptureResult(
        functools.partial(make_function, fn, cg),
        build_guard_function(fn, output.guards, shape_guards(output)),
        gm,
        break_info,
        resumes,
        after_graph=graph_then_epilogue(fn, output, compiled, cg),
        first_inputs=graph_inputs(output, compiled),
    )


# (values popped, as a negative count; values pushed) where the bytecode library reports
# only the net effect
NATIVE_STACK_EFFECTS = {"BEFORE_WITH": (-1, 2)}


def native_form(inst) -> tuple:
    """The instruction that runs natively for ``inst`` at a break, and the NULL mask of what
    ``inst`` pushes. A load that pushes a NULL or a ``self`` beside its value (known only at
    run time) loads the value alone: the resume function pushes the NULL, so that no NULL
    is ever packed into the tuple of stack values it is called with."""
    plain = versions.without_pushed_null(inst)
    if plain is not None:
        return plain, versions.value_and_null()
    _, pushed = native_stack_effect(inst)
    return copy_instr(inst), (False,) * pushed


def native_stack_effect(inst) -> tuple[int, int]:
    """What ``inst``, run natively, pops (a negative count) and pushes."""
    if inst.name in NATIVE_STACK_EFFECTS:
        return NATIVE_STACK_EFFECTS[inst.name]
    popped, pushed = inst.pre_and_post_stack_effect(jump=False)
    if popped > 0:  # the library's default for an instruction it has no entry for: a net push
        return 0, popped
    return popped, pushed


def call_comprehension(cg, fn, root, comprehension, live, cells, wrap_callee, handler_entry):
    """At the start of a comprehension inlined in the frame (3.12+): push the values of the
    names it saves, then its result, computed by the comprehension cut out as a function
    (of the iterator, the live locals and the frame's cells) and called natively (and
    captured on its own); the values below its iterator."""
    below, iterator = list(root.stack[:-1]), root.stack[-1]
    reconstruct_values(cg, below)
    for name in comprehension.saved:
        if not _unbound(live.get(name, DeletedVariable())):
            cg.reconstruct(live[name])
    names = tuple(live)
    function = wrap_callee(comprehension_function(fn, comprehension.start, names))
    cg.begin_handler_region(handler_entry)
    cg.call(
        lambda: cg.load_const(function),
        [
            lambda: cg.reconstruct(iterator),
            *(lambda n=n: cg.reconstruct(live[n]) for n in names),
            *(lambda n=n: cg.load_closure(n) for n in cells),
        ],
    )
    cg.end_handler_region(handler_entry)
    return below


def _unbound(v) -> bool:
    return isinstance(v, DeletedVariable)


def direct_call(output: OutputGraph, compiled, indices, returned):
    """(compiled, input expressions, output index) if the frame only returns one graph
    output and has no side effects; else None."""
    if compiled is None or id(returned) not in indices or not output.side_effects.is_empty():
        return None
    return compiled, input_expressions(output), indices[id(returned)]


def graph_then_epilogue(fn, output: OutputGraph, compiled, cg: Codegen):
    """(compiled, input expressions, epilogue function) where the frame calls a graph."""
    code = cg.epilogue_code() if compiled is not None else None
    if code is None:
        return None
    epilogue = function_over(fn, code)
    epilogue.__kiln_keep_alive__ = cg.keep_alive
    return compiled, input_expressions(output), epilogue


def graph_inputs(output: OutputGraph, compiled) -> list | None:
    """The graph's inputs in the call that was captured (what the backend was given)."""
    return None if compiled is None else [value for _, value, _ in output.inputs]


def input_expressions(output: OutputGraph) -> list[str]:
    """The guard expression of each graph input (each is read by a guard)."""
    return [source.expr() for source, _, _ in output.inputs]


def shape_guards(output: OutputGraph) -> list[str]:
    """Guards on symbolic sizes that the trace relied on, as Python over the arguments."""
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    from kiln_capture.guards import ShapeSource

    dynamic = [(s, var) for s, _, var in output.inputs if s.expr() in output.symbolic_inputs]
    if not dynamic:
        return []
    fakes = [var.example for _, var in dynamic]
    sources = [ShapeSource(s.expr()) for s, _ in dynamic]
    contexts = [output.symbolic_contexts.get(s.expr()) for s, _ in dynamic]
    # ignore_static=False: a dimension asked to be dynamic that the trace fixed to a number
    # (a size of 0 or 1, or a guard such as x[1:] at size 2) is guarded on that number; the
    # tensor guards do not check the sizes of dimensions marked dynamic
    try:
        found = output.shape_env.produce_guards(
            fakes, sources, input_contexts=contexts, ignore_static=False
        )
    except ConstraintViolationError as exc:  # a marked range the code does not keep
        warn_marked_dims_fixed(exc)
        found = output.shape_env.produce_guards(fakes, sources, ignore_static=False)
    found = without_unread_offsets(found, output.graph, output.reads_storage_offsets)
    # the modules torch's printer names, as the guard's scope has them (a parameter of
    # the function may be called ``math``)
    return [MODULE_NAMES.sub(r"___\1.", code) for code in found]


MODULE_NAMES = re.compile(r"(?<![\w.'\"])(math|torch)\.")


def warn_marked_dims_fixed(exc: Exception) -> None:
    import warnings

    from kiln_capture.user_frames import user_stacklevel

    detail = str(exc).strip().splitlines()
    warnings.warn(
        "kiln-capture: a dimension marked with mark_dynamic cannot be symbolic here: "
        f"{' '.join(line.strip() for line in detail[:6])} The graph is compiled for the "
        "size the code needs, and guarded on it; mark_dynamic only dimensions that vary",
        RuntimeWarning,
        stacklevel=user_stacklevel(),
    )


def make_function(fn, cg: Codegen) -> types.FunctionType:
    new = function_over(fn, cg.to_code(), fn.__name__)
    new.__kiln_keep_alive__ = cg.keep_alive
    return new


__all__ = ["CaptureResult", "convert_frame", "operator"]
