"""Graph breaks inside a comprehension that CPython 3.12 inlines into its frame (PEP 709).

Before 3.12 a comprehension is a function of its own: a break inside it breaks the frame at
the comprehension's call, which runs natively and is captured on its own. From 3.12 the
comprehension's loop is part of the frame's code::

    GET_ITER; LOAD_FAST_AND_CLEAR t; SWAP 2; BUILD_LIST 0; SWAP 2   (the prelude)
    FOR_ITER ... LIST_APPEND 2; JUMP_BACKWARD                        (the loop)
    END_FOR; ...                                                     (t is restored after)

A break inside it is moved to its first ``LOAD_FAST_AND_CLEAR``. There the comprehension,
cut out of the frame's code as a function of the iterator (``.0``, named ``implicit0``) and
the frame's live locals, is called natively and captured on its own, as before 3.12; the
frame resumes after the loop with the saved locals and the comprehension's result on its
stack, as the inlined code leaves them.
"""

from __future__ import annotations

import dataclasses
import functools
import types

from bytecode import Bytecode, Instr, TryBegin, TryEnd

from kiln_capture.program import Program, load_program
from kiln_capture.resume import CELLS_PASSED_IN, cells_as_parameters

PROLOGUE_OPS = ("MAKE_CELL", "COPY_FREE_VARS", "RESUME", "NOP")
ITERATOR = "implicit0"
RESULT = object()  # the comprehension's list, set or dict in a stack layout
# code of a cut-out comprehension -> the instruction where its own comprehension starts
CUT_OUT: dict[types.CodeType, int] = {}


@dataclasses.dataclass(frozen=True)
class Comprehension:
    start: int  # the first LOAD_FAST_AND_CLEAR
    end_for: int  # the loop's END_FOR; the frame resumes after it
    # the stack the comprehension leaves below its result: the names whose values it saved
    saved: tuple[str, ...]


def comprehension_at(program: Program, start: int) -> Comprehension | None:
    """The inlined comprehension whose prelude begins at ``start``, if one does."""
    instrs = program.instrs
    if instrs[start].name != "LOAD_FAST_AND_CLEAR" or (
        start > 0 and instrs[start - 1].name == "LOAD_FAST_AND_CLEAR"
    ):
        return None
    stack: list = ["iterator"]
    i = start
    while instrs[i].name != "FOR_ITER":
        inst = instrs[i]
        if inst.name == "LOAD_FAST_AND_CLEAR":
            stack.append(inst.arg if isinstance(inst.arg, str) else inst.arg.name)
        elif inst.name == "SWAP":
            stack[-1], stack[-inst.arg] = stack[-inst.arg], stack[-1]
        elif inst.name in ("BUILD_LIST", "BUILD_SET", "BUILD_MAP") and inst.arg == 0:
            stack.append(RESULT)
        else:
            return None
        i += 1
    end_for = program.target(instrs[i].arg)
    if stack[-2:] != [RESULT, "iterator"] or instrs[end_for].name != "END_FOR":
        return None
    return Comprehension(start, end_for, tuple(stack[:-2]))


def enclosing_comprehension(program: Program, index: int) -> Comprehension | None:
    """The outermost inlined comprehension whose code holds instruction ``index`` (not the
    one a cut-out comprehension function is made of)."""
    own = CUT_OUT.get(program.code)
    for start in range(index):
        if start == own:
            continue
        found = comprehension_at(program, start)
        if found is not None and found.start < index <= found.end_for:
            return found
    return None


@functools.lru_cache(maxsize=1024)
def comprehension_code(
    code: types.CodeType, start: int, local_names: tuple[str, ...]
) -> types.CodeType:
    """The comprehension at ``start`` of ``code`` as the code of a function
    ``(implicit0, *local_names)`` that returns the comprehension's result."""
    program = load_program(code)
    found = comprehension_at(program, start)
    original = Bytecode.from_code(code)
    items = list(original)
    prologue = []
    for item in items:
        if not (isinstance(item, Instr) and item.name in PROLOGUE_OPS):
            break
        prologue.append(item)
    body = items[program.positions[start] : program.positions[found.end_for] + 1]
    # the handler that restores the saved locals on an exception is not needed: they are
    # this function's own
    body = [item for item in body if not isinstance(item, (TryBegin, TryEnd))]
    # the frame's cells are passed in, so that the comprehension shares them with the frame
    prologue, cells = cells_as_parameters(code, prologue, body)
    cut = Bytecode([*prologue, Instr("LOAD_FAST", ITERATOR), *body, Instr("RETURN_VALUE")])
    cut._copy_attr_from(original)
    cut.cellvars = list(cells)
    cut.freevars = []
    cut.argnames = [ITERATOR, *local_names, *cells]
    cut.argcount = len(cut.argnames)
    cut.posonlyargcount = 0
    cut.kwonlyargcount = 0
    cut.flags &= ~(0x04 | 0x08)  # no *args / **kwargs
    cut.name = f"{code.co_name}_comprehension_at_{start}"
    cut.qualname = f"{code.co_qualname}_comprehension_at_{start}"
    new_code = cut.to_code()
    CUT_OUT[new_code] = len(prologue) + 1
    CELLS_PASSED_IN.add(new_code)
    return new_code


def comprehension_function(
    fn: types.FunctionType, start: int, local_names: tuple[str, ...]
) -> types.FunctionType:
    code = comprehension_code(fn.__code__, start, local_names)
    return types.FunctionType(code, fn.__globals__, code.co_name)
