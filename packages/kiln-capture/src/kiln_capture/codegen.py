"""Emitting bytecode for the transformed frame: reload graph inputs from their sources,
call the compiled graph, replay side effects, rebuild outputs, and call resume functions.

What follows the graph call is also made into a function of its own, the *epilogue*
``epilogue(___graph_out, <the frame's parameters>)``: the dispatcher, whose guards have
already read every graph input, calls the graph itself and then the epilogue, so that no
input is read twice.
"""

from __future__ import annotations

import copy
import functools
import types

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label

from kiln_capture import versions
from kiln_capture.variables.base import Variable
from kiln_capture.variables.class_statements import refuse_escaping_class

PROLOGUE_OPS = ("MAKE_CELL", "COPY_FREE_VARS", "RESUME", "NOP")
GRAPH_OUT = "___graph_out"


class Codegen:
    def __init__(self, code: types.CodeType, graph_outputs: dict[int, int]):
        self.code = code
        self.instrs: list = []
        self.graph_outputs = graph_outputs  # id(variable) -> index in the graph's output
        self.cached: dict[int, str] = {}  # id(mutable variable) -> temporary holding it
        self.keep_alive: list = []
        self.prologue_end = 0  # instructions of the prologue
        self.graph_called_at: int | None = None  # the first instruction after the graph call
        self.frame_cells: dict[int, str] = {}  # id(cell variable) -> the frame's name for it

    # --- primitives -------------------------------------------------------------

    def emit(self, *instrs) -> None:
        self.instrs.extend(instrs)

    def load_const(self, value) -> None:
        refuse_escaping_class(value)
        self.emit(Instr("LOAD_CONST", value))

    def load_local(self, name: str) -> None:
        if name in self.code.co_cellvars:
            self.emit(Instr("LOAD_DEREF", CellVar(name)))
        elif name in self.code.co_freevars:
            self.emit(Instr("LOAD_DEREF", FreeVar(name)))
        else:
            self.emit(Instr("LOAD_FAST", name))

    def store_local(self, name: str) -> None:
        if name in self.code.co_cellvars:
            self.emit(Instr("STORE_DEREF", CellVar(name)))
        else:
            self.emit(Instr("STORE_FAST", name))

    def load_deref(self, name: str) -> None:
        self.emit(
            Instr("LOAD_DEREF", FreeVar(name) if name in self.code.co_freevars else CellVar(name))
        )

    def load_closure(self, name: str) -> None:
        """Push the cell object of the frame's cell or free variable ``name``."""
        var = FreeVar(name) if name in self.code.co_freevars else CellVar(name)
        self.emit(versions.load_closure_instr(var))

    def load_cell(self, cell) -> None:
        """Push the real cell that the traced ``cell`` stands for: the frame's own (by
        name), one read through a closure (from its source), one that existed before the
        trace, or a new one with the cell's contents (one made in an inlined call, whose
        frame is gone)."""
        from kiln_capture.sources import AttrSource

        name = self.frame_cells.get(id(cell))
        if name is not None:
            self.load_closure(name)
        elif isinstance(cell.source, AttrSource) and cell.source.attr == "cell_contents":
            cell.source.base.emit(self)  # a closure's cell, read where the closure is read
        elif cell.real_cell is not None:
            self.load_const(cell.real_cell)
        else:
            contents = [] if cell.contents is None else [cell.contents]
            self.call_object(types.CellType, contents)

    def load_global(self, name: str) -> None:
        self.emit(versions.load_global_instr(name))

    def store_global(self, name: str) -> None:
        self.emit(Instr("STORE_GLOBAL", name))

    def load_attr(self, name: str) -> None:
        self.emit(versions.load_attr_instr(name))

    def store_attr(self, name: str) -> None:
        self.emit(Instr("STORE_ATTR", name))

    def subscr(self) -> None:
        self.emit(Instr("BINARY_SUBSCR"))

    def store_subscr(self) -> None:
        self.emit(Instr("STORE_SUBSCR"))

    def store_temp(self, name: str) -> None:
        self.emit(Instr("STORE_FAST", name))

    def load_temp(self, name: str) -> None:
        self.emit(Instr("LOAD_FAST", name))

    def pop_top(self) -> None:
        self.emit(Instr("POP_TOP"))

    def push_null(self) -> None:
        self.emit(Instr("PUSH_NULL"))

    def build(self, cls: type, n: int) -> None:
        op = {tuple: "BUILD_TUPLE", list: "BUILD_LIST", set: "BUILD_SET", dict: "BUILD_MAP"}
        if cls in op:
            self.emit(Instr(op[cls], n))
            return
        self.emit(Instr("BUILD_TUPLE", n))
        self.wrap_call(cls)

    def build_sequence(self, cls: type, items: list[Variable]) -> None:
        for item in items:
            self.reconstruct(item)
        self.build(cls, len(items))

    # --- calls ------------------------------------------------------------------

    def push_callable(self, emit_callable) -> None:
        """The callable and the NULL that marks a plain call, in this version's order."""
        if versions.null_before_callable():
            self.push_null()
            emit_callable()
        else:
            emit_callable()
            self.push_null()

    def call(self, emit_callable, emit_args: list, kw_names: tuple[str, ...] = ()) -> None:
        self.push_callable(emit_callable)
        for emit_arg in emit_args:
            emit_arg()
        self.emit(*versions.call_instrs(len(emit_args), kw_names))

    def call_object(self, obj, args: list[Variable], kw_names: tuple[str, ...] = ()) -> None:
        self.call(
            lambda: self.load_const(obj), [lambda a=a: self.reconstruct(a) for a in args], kw_names
        )

    def wrap_call(self, fn) -> None:
        """Replace the top of the stack by ``fn(top)``."""
        self.emit(Instr("STORE_FAST", "___tmp_arg"))
        self.call(
            lambda: self.load_const(fn), [lambda: self.emit(Instr("LOAD_FAST", "___tmp_arg"))]
        )

    def call_method_on_tos(self, name: str, args: list[Variable]) -> None:
        """Replace the top of the stack ``obj`` by ``obj.name(*args)``."""
        self.load_attr(name)
        self.emit(Instr("STORE_FAST", "___tmp_method"))
        self.call(
            lambda: self.emit(Instr("LOAD_FAST", "___tmp_method")),
            [lambda a=a: self.reconstruct(a) for a in args],
        )

    # --- values -----------------------------------------------------------------

    def reconstruct(self, variable: Variable) -> None:
        """Push ``variable``'s value; a mutable value is built once and then reused."""
        key = id(variable)
        if key in self.cached:
            self.emit(Instr("LOAD_FAST", self.cached[key]))
            return
        variable.reconstruct(self)
        if variable.mutable and variable.source is None:
            name = f"___value{len(self.cached)}"
            self.cached[key] = name
            self.keep_alive.append(variable)
            self.emit(Instr("COPY", 1), Instr("STORE_FAST", name))

    def load_graph_value(self, variable) -> None:
        index = self.graph_outputs.get(id(variable))
        if index is not None:
            self.emit(Instr("LOAD_FAST", GRAPH_OUT))
            self.load_const(index)
            self.subscr()
            return
        if variable.source is not None:
            variable.source.emit(self)
            return
        from kiln_capture.exc import CaptureFailed

        raise CaptureFailed(f"{variable.describe()} is neither a graph output nor an input")

    # --- frames -----------------------------------------------------------------

    def prologue(self) -> None:
        from kiln_capture.program import load_program

        for inst in load_program(self.code).abstract:  # decoded once per code object
            if not isinstance(inst, Instr) or inst.name not in PROLOGUE_OPS:
                break
            self.emit(Instr(inst.name, inst.arg) if inst.arg is not None else Instr(inst.name))
        self.prologue_end = len(self.instrs)

    def call_graph(self, compiled, input_sources: list) -> None:
        self.call(
            lambda: self.load_const(compiled), [lambda s=s: s.emit(self) for s in input_sources]
        )
        self.emit(Instr("STORE_FAST", GRAPH_OUT))
        self.graph_called_at = len(self.instrs)

    def call_resume(
        self, resume_fn, stack_depth: int, local_names: list[str], cell_names: tuple[str, ...] = ()
    ) -> None:
        """Call ``resume_fn(*stack, *locals, *cells)`` with the stack left by the native
        instruction; the cells are passed as cell objects."""
        self.emit(Instr("BUILD_TUPLE", stack_depth), Instr("STORE_FAST", "___stack"))
        self.push_callable(lambda: self.load_const(resume_fn))
        self.emit(Instr("LOAD_FAST", "___stack"))
        for name in local_names:
            self.load_local(name)
        for name in cell_names:
            self.load_closure(name)
        self.emit(Instr("BUILD_TUPLE", len(local_names) + len(cell_names)))
        self.emit(Instr("BINARY_OP", _ADD))
        self.emit(Instr("CALL_FUNCTION_EX", 0))
        self.emit(Instr("RETURN_VALUE"))

    def begin_handler_region(self, entry) -> None:
        if entry is not None:
            self.emit(entry)

    def end_handler_region(self, entry) -> None:
        if entry is not None:
            from bytecode import TryEnd

            self.emit(TryEnd(entry))

    def in_handler_region(self, entry, instr) -> None:
        """Emit ``instr`` so that an exception it raises goes to ``entry``'s handler."""
        self.begin_handler_region(entry)
        self.emit(instr)
        self.end_handler_region(entry)

    def emit_return(self) -> None:
        self.emit(Instr("RETURN_VALUE"))

    def make_function(self, code: types.CodeType, flags: int) -> None:
        """MAKE_FUNCTION for ``code``, its defaults already pushed as ``flags`` says."""
        self.load_const(code)
        self.emit(*versions.make_function_instrs(flags))

    def new_label(self) -> Label:
        return Label()

    def to_code(self, name_suffix: str = "") -> types.CodeType:
        return self._assemble(self.instrs, name_suffix)

    def epilogue_code(self) -> types.CodeType | None:
        """The instructions after the graph call, as the code of
        ``epilogue(___graph_out, <the frame's parameters>)``; None without a graph call."""
        if self.graph_called_at is None:
            return None
        instrs = self.instrs[: self.prologue_end] + self.instrs[self.graph_called_at :]
        return self._assemble(instrs, "_after_graph", first_argument=GRAPH_OUT)

    def _assemble(self, instrs, name_suffix: str, first_argument: str | None = None):
        bytecode = copy.copy(_attributes_of(self.code))  # the name, arguments, flags, ...
        bytecode.extend(instrs)
        bytecode.flags &= ~(0x20 | 0x80 | 0x100 | 0x200)
        if name_suffix:
            bytecode.name = self.code.co_name + name_suffix
        if first_argument is not None:
            bytecode.argnames = [first_argument, *bytecode.argnames]
            bytecode.argcount += 1
            if bytecode.posonlyargcount:
                bytecode.posonlyargcount += 1
        # a handler region keeps the depth of the original's handler (its resume function
        # takes that many values); computed along the flow, it would count values pushed
        # for the native instruction that the original's handler does not keep (the values
        # below a call's operands; from 3.12 the iterator under a FOR_ITER's jump)
        return bytecode.to_code(compute_exception_stack_depths=False)


@functools.lru_cache(maxsize=512)
def _attributes_of(code: types.CodeType) -> Bytecode:
    """``code``'s attributes as a ``Bytecode`` without instructions, to copy (decoding a
    frame's code for them costs milliseconds, and every capture of it assembles its code)."""
    bytecode = Bytecode.from_code(code)
    bytecode.clear()
    return bytecode


def _binary_add():
    from bytecode import BinaryOp

    return BinaryOp.ADD


_ADD = _binary_add()


def function_over(fn: types.FunctionType, code: types.CodeType, name: str | None = None):
    """``code`` as a function with ``fn``'s globals, defaults and closure (named ``name``,
    else as the code names itself): the transformed frame, its epilogue, a kept epilogue."""
    made = types.FunctionType(
        code, fn.__globals__, name or code.co_name, fn.__defaults__, fn.__closure__
    )
    made.__kwdefaults__ = fn.__kwdefaults__
    return made
