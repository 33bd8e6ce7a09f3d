"""Resume functions: the rest of a frame after a graph break, as a new code object.

``resume_at(i)`` is the original code with a prologue that puts the saved stack back and
jumps to instruction ``i``. Its arguments are the stack values (NULLs are pushed by the
prologue, never passed), then the live locals under their own names, then the frame's
cells. Since 3.11 exception handling is a table of instruction ranges, the jump may land
inside a ``try`` body. A resume function is captured like any other function.

Cells are passed as the cell objects themselves, so that functions made before the break
(which hold them) keep sharing them with the rest of the frame. Each cell and free variable
of the original becomes a cell variable that is also a parameter, and the prologue does not
run MAKE_CELL or COPY_FREE_VARS: the argument (a cell) stays in the frame's slot as it is,
which is where LOAD_DEREF, STORE_DEREF and LOAD_CLOSURE look for the cell. A resume
function thus has no closure of its own, and one function serves every call.
"""

from __future__ import annotations

import functools
import types

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label

from kiln_capture.program import Program

PROLOGUE_OPS = ("MAKE_CELL", "COPY_FREE_VARS", "RESUME", "NOP")
# the cells of a resume function arrive as arguments (see the module docstring)
CELL_SETUP_OPS = ("MAKE_CELL", "COPY_FREE_VARS")
STACK_PREFIX = "___stack"

# resume code -> (the code it was cut from, how many instructions it has more before the
# target than the original: its setup less the dropped cell setup), so that a
# break inside a resume function resumes the original code again: a loop that breaks at every
# iteration reuses one resume function instead of making a new one each time.
RESUME_ORIGINS: dict[types.CodeType, tuple[types.CodeType, int]] = {}
# codes whose cell variables are parameters that arrive as cells (see the module docstring)
CELLS_PASSED_IN: set[types.CodeType] = set()


@functools.lru_cache(maxsize=1024)
def resume_code(
    code: types.CodeType, target: int, null_mask: tuple[bool, ...], local_names: tuple[str, ...]
) -> types.CodeType:
    """``null_mask`` has one entry per stack slot: True where the slot holds the NULL that
    marks a call (pushed again here), False where the value arrives as an argument."""
    from kiln_capture.program import load_program

    program: Program = load_program(code)
    original = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    items = list(original)
    # the same instruction objects as ``program`` sees, re-read from a fresh copy
    position = program.positions[target]
    label = Label()
    items.insert(position, label)

    prologue, rest = [], items
    while rest and isinstance(rest[0], Instr) and rest[0].name in PROLOGUE_OPS:
        prologue.append(rest[0])
        rest = rest[1:]
    kept, cells = cells_as_parameters(code, prologue, rest)
    stack_names = fresh_names(STACK_PREFIX, null_mask.count(False), set(local_names) | set(cells))
    values = iter(stack_names)
    setup = [
        Instr("PUSH_NULL") if is_null else Instr("LOAD_FAST", next(values)) for is_null in null_mask
    ]
    setup.append(Instr("JUMP_FORWARD", label))

    resumed = Bytecode(kept + setup + rest)
    resumed._copy_attr_from(original)
    resumed.argnames = stack_names + list(local_names) + list(cells)
    resumed.argcount = len(resumed.argnames)
    resumed.posonlyargcount = 0
    resumed.kwonlyargcount = 0
    resumed.flags &= ~(0x04 | 0x08)  # no *args / **kwargs
    resumed.name = f"{code.co_name}_resume_at_{target}"
    if hasattr(resumed, "qualname"):
        resumed.qualname = f"{code.co_qualname}_resume_at_{target}"
    # The jump lands past the TryBegin of a block it resumes inside, so the stack depths of
    # the exception table cannot be recomputed along the flow: they are the original's (the
    # stack at the target is the original's), and so is the room the handlers need.
    resumed.cellvars = list(cells)
    resumed.freevars = []
    new_code = resumed.to_code(stacksize=code.co_stacksize, compute_exception_stack_depths=False)
    RESUME_ORIGINS[new_code] = (code, len(setup) - (len(prologue) - len(kept)))
    CELLS_PASSED_IN.add(new_code)
    return new_code


def make_resume_function(
    fn: types.FunctionType, target: int, null_mask: tuple[bool, ...], local_names: tuple[str, ...]
) -> types.FunctionType:
    code, target = original_position(fn.__code__, target)
    new_code = resume_code(code, target, null_mask, local_names)
    return types.FunctionType(new_code, fn.__globals__, new_code.co_name)


def cell_names(code: types.CodeType) -> tuple[str, ...]:
    """The cells a resume function of ``code`` takes, in the order it takes them: the
    original's cell variables then its free variables (a resume function's own cell
    variables are exactly these, in this order, so this holds for it too)."""
    return code.co_cellvars + code.co_freevars


def cells_as_parameters(code: types.CodeType, prologue: list, body: list) -> tuple[list, tuple]:
    """For a function made of ``code``'s ``body`` that takes ``code``'s cells as its last
    parameters: the prologue without its cell setup, and the cells' names. Free variables
    in ``body`` become cell variables (the instructions are changed in place); the new
    code's ``cellvars`` must be set to the names and its ``freevars`` emptied."""
    kept = [inst for inst in prologue if inst.name not in CELL_SETUP_OPS]
    for inst in body:
        if isinstance(inst, Instr) and isinstance(inst.arg, FreeVar):
            inst.arg = CellVar(inst.arg.name)
    return kept, cell_names(code)


def passed_cells(code: types.CodeType) -> tuple[str, ...]:
    """The parameters of ``code`` that are cells passed in (a resume function's, a
    comprehension's cut out of a frame)."""
    return code.co_cellvars if code in CELLS_PASSED_IN else ()


def original_position(code: types.CodeType, index: int) -> tuple[types.CodeType, int]:
    """The original code and instruction that ``index`` of a resume function stands for."""
    while code in RESUME_ORIGINS:
        code, shift = RESUME_ORIGINS[code]
        index -= shift
    return code, index


def is_resume_argument(name: str) -> bool:
    """A saved stack value: it is on the stack once the resume function starts."""
    return name.startswith(STACK_PREFIX)


def fresh_names(prefix: str, count: int, taken: set[str]) -> list[str]:
    """``count`` names starting with ``prefix`` that are not in ``taken``."""
    level = 0
    while any(f"{prefix}{level}_{i}" in taken for i in range(count)):
        level += 1
    return [f"{prefix}{level}_{i}" for i in range(count)]
