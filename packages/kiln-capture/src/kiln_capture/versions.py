"""Everything that differs between CPython versions, in one place.

Opcode handlers register with the versions they serve (``@handles("PRECALL",
max_version=(3, 11))``), and the bytecode sequences that differ per version (calls,
attribute loads, the NULL that precedes a callable) are emitted from here. The rest of
kiln-capture is written against this layer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from bytecode import Instr

PY = sys.version_info[:2]
SUPPORTED = ((3, 11), (3, 12), (3, 13))

HANDLERS: dict[str, Callable] = {}


def handles(*names: str, min_version=(3, 11), max_version=(3, 99)):
    """Register an opcode handler ``fn(tx, inst)`` for the versions it serves."""

    def register(fn):
        if min_version <= PY <= max_version:
            for name in names:
                assert name not in HANDLERS, f"two handlers for {name}"
                HANDLERS[name] = fn
        return fn

    return register


def is_supported_version() -> bool:
    return PY in SUPPORTED


def for_iter_exit_skips() -> tuple[str, ...]:
    """The instructions at a ``for`` loop's exit (FOR_ITER's target) that an exhausted
    FOR_ITER jumps past, having popped its iterator: none in 3.11, END_FOR in 3.12, END_FOR
    and POP_TOP in 3.13 (the compiler counts the jump as keeping the iterator and these as
    popping it)."""
    if PY >= (3, 13):
        return ("END_FOR", "POP_TOP")
    if PY >= (3, 12):
        return ("END_FOR",)
    return ()


# --- emitting -----------------------------------------------------------------------


def null_before_callable() -> bool:
    """Before 3.13 the NULL that marks a plain call sits below the callable."""
    return PY < (3, 13)


def call_instrs(nargs: int, kw_names: tuple[str, ...] = ()) -> list[Instr]:
    """Instructions that call ``callable, NULL-or-self`` (in this version's order) + args."""
    if PY >= (3, 13):
        if kw_names:
            return [Instr("LOAD_CONST", kw_names), Instr("CALL_KW", nargs)]
        return [Instr("CALL", nargs)]
    out = [Instr("KW_NAMES", kw_names)] if kw_names else []
    if PY == (3, 11):
        out.append(Instr("PRECALL", nargs))
    out.append(Instr("CALL", nargs))
    return out


def load_global_instr(name: str, push_null: bool = False) -> Instr:
    return Instr("LOAD_GLOBAL", (push_null, name))


def load_attr_instr(name: str) -> Instr:
    if PY >= (3, 12):
        return Instr("LOAD_ATTR", (False, name))
    return Instr("LOAD_ATTR", name)


def without_pushed_null(inst: Instr) -> Instr | None:
    """``inst`` as the load of its value alone, where it also pushes a NULL or a ``self``
    beside it (LOAD_METHOD; LOAD_ATTR, LOAD_SUPER_ATTR and LOAD_GLOBAL with their flag);
    None for any other instruction. A NULL beside the bound attribute calls as the method
    and its ``self`` do."""
    if inst.name == "LOAD_METHOD":
        return Instr("LOAD_ATTR", inst.arg, location=inst.location)
    flagged = ("LOAD_ATTR", "LOAD_SUPER_ATTR", "LOAD_GLOBAL")
    if inst.name in flagged and isinstance(inst.arg, tuple) and inst.arg[0]:
        return Instr(inst.name, (False, *inst.arg[1:]), location=inst.location)
    return None


def value_and_null() -> tuple[bool, bool]:
    """Which of a loaded callable and its NULL is the NULL, in stack order."""
    return (True, False) if null_before_callable() else (False, True)


def for_iter_exit_instrs() -> list[Instr]:
    """What follows the exit label of a FOR_ITER emitted natively: the instructions it
    skips, never run but there so that the stack depth at the label, computed along the
    jump, comes out as CPython leaves it (the iterator popped)."""
    return [Instr(name) for name in for_iter_exit_skips()]


def return_const_instrs(value) -> list[Instr]:
    return [Instr("LOAD_CONST", value), Instr("RETURN_VALUE")]


def make_function_instrs(flags: int) -> list[Instr]:
    """MAKE_FUNCTION of the code on top of the stack, with the attributes ``flags`` names
    pushed below it in flag order (defaults, kwdefaults, annotations, closure): 3.13 sets
    them one by one, the last pushed first."""
    if PY < (3, 13):
        return [Instr("MAKE_FUNCTION", flags)]
    attributes = [Instr("SET_FUNCTION_ATTRIBUTE", f) for f in (0x08, 0x04, 0x02, 0x01) if flags & f]
    return [Instr("MAKE_FUNCTION"), *attributes]


def load_closure_instr(var) -> Instr:
    """Push the cell object of a cell or free variable (``CellVar``/``FreeVar``): 3.13 made
    LOAD_CLOSURE a pseudo-instruction that is LOAD_FAST of the cell's slot."""
    return Instr("LOAD_CLOSURE" if PY < (3, 13) else "LOAD_FAST", var)
