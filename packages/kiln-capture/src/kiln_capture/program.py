"""A code object as a list of instructions the interpreter can step through.

Built from the ``bytecode`` library's abstract form: jump targets become instruction
indices. Each instruction knows the exception handler that covers it (target, stack depth,
whether the offset is pushed), read from CPython's own exception table through ``dis``.
The abstract form is kept so that resume functions can be cut from it.
"""

from __future__ import annotations

import dis
import functools
import types
from dataclasses import dataclass, field

from bytecode import Bytecode, Instr, Label


@dataclass(frozen=True)
class Handler:
    target: int  # index of the handler's first instruction
    stack_depth: int
    push_lasti: bool


@dataclass
class Program:
    code: types.CodeType
    abstract: list  # the Bytecode items: Instr, Label, TryBegin, TryEnd, SetLineno
    instrs: list[Instr]
    positions: list[int]  # index of each instruction in ``abstract``
    label_index: dict[int, int]  # id(Label) -> index of the instruction after it
    handlers: list[Handler | None]
    # instruction index -> its place as a traceback writes it: every node a layer records
    # asks again, and each of a model's layers runs the same instructions
    traceback_text: dict[int, str] = field(default_factory=dict)

    def target(self, label: Label) -> int:
        return self.label_index[id(label)]

    def where(self, index: int) -> str:
        lineno = self.instrs[index].lineno if 0 <= index < len(self.instrs) else None
        return f"{self.code.co_filename}:{lineno} in {self.code.co_name}"


@functools.lru_cache(maxsize=512)
def load_program(code: types.CodeType) -> Program:
    abstract = list(Bytecode.from_code(code))
    instrs, positions = [], []
    label_index: dict[int, int] = {}
    for position, item in enumerate(abstract):
        if isinstance(item, Label):
            label_index[id(item)] = len(instrs)
        elif isinstance(item, Instr):
            instrs.append(item)
            positions.append(position)
    handlers = exception_handlers(code, instrs)
    return Program(code, abstract, instrs, positions, label_index, handlers)


def exception_handlers(code: types.CodeType, instrs: list[Instr]) -> list[Handler | None]:
    """The handler covering each instruction, from CPython's exception table."""
    if not getattr(code, "co_exceptiontable", b""):  # no try, with or comprehension
        return [None] * len(instrs)
    real = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    if [i.opname for i in real] != [i.name for i in instrs]:
        raise RuntimeError(f"instructions of {code.co_qualname} do not line up with dis")
    index_of = {inst.offset: n for n, inst in enumerate(real)}
    handlers: list[Handler | None] = [None] * len(real)
    for entry in dis.Bytecode(code).exception_entries:
        handler = Handler(index_of[entry.target], entry.depth, entry.lasti)
        for n, inst in enumerate(real):
            if entry.start <= inst.offset < entry.end:
                handlers[n] = handler
    return handlers


def _line(program: Program, index: int) -> tuple[int | None, str]:
    """An instruction's line number and the text of that line of the user's source."""
    import linecache

    lineno = program.instrs[index].lineno
    return lineno, linecache.getline(program.code.co_filename, lineno or 0).strip()


def traceback_lines(program: Program, index: int) -> str:
    """An instruction's place as a traceback's two lines (file, line, function; code)."""
    found = program.traceback_text.get(index)
    if found is None:
        lineno, text = _line(program, index)
        code = program.code
        found = f'  File "{code.co_filename}", line {lineno or 0}, in {code.co_name}\n    {text}\n'
        program.traceback_text[index] = found
    return found


def source_line(program: Program, index: int) -> str:
    """The user's source line of an instruction, for messages."""
    lineno, text = _line(program, index)
    return f"{program.code.co_filename}:{lineno} in {program.code.co_name}: {text}"
