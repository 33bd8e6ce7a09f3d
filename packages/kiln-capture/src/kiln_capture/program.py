"""A code object as a list of instructions the interpreter can step through.

Built from the ``bytecode`` library's abstract form: jump targets become instruction
indices, and each instruction knows the exception handler (``TryBegin``) that covers it.
The abstract form is kept so that resume functions can be cut from it.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

from bytecode import Bytecode, Instr, Label, TryBegin, TryEnd


@dataclass
class Program:
    code: types.CodeType
    abstract: list  # the Bytecode items: Instr, Label, TryBegin, TryEnd, SetLineno
    instrs: list[Instr]
    positions: list[int]  # index of each instruction in ``abstract``
    label_index: dict[int, int]  # id(Label) -> index of the instruction after it
    handlers: list[TryBegin | None]

    def target(self, label: Label) -> int:
        return self.label_index[id(label)]

    def where(self, index: int) -> str:
        lineno = self.instrs[index].lineno if 0 <= index < len(self.instrs) else None
        return f"{self.code.co_filename}:{lineno} in {self.code.co_name}"


@functools.lru_cache(maxsize=512)
def load_program(code: types.CodeType) -> Program:
    abstract = list(Bytecode.from_code(code))
    instrs, positions, handlers = [], [], []
    label_index: dict[int, int] = {}
    active: TryBegin | None = None
    for position, item in enumerate(abstract):
        if isinstance(item, Label):
            label_index[id(item)] = len(instrs)
        elif isinstance(item, TryBegin):
            active = item
        elif isinstance(item, TryEnd):
            active = None
        elif isinstance(item, Instr):
            instrs.append(item)
            positions.append(position)
            handlers.append(active)
    return Program(code, abstract, instrs, positions, label_index, handlers)


def source_line(program: Program, index: int) -> str:
    """The user's source line of an instruction, for messages."""
    import linecache

    lineno = program.instrs[index].lineno
    text = linecache.getline(program.code.co_filename, lineno or 0).strip()
    return f"{program.code.co_filename}:{lineno} in {program.code.co_name}: {text}"
