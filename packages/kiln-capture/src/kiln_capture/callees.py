"""A function whose reads of global names go through a callback: what a function that runs
eagerly (capture gave up on its frame) runs instead, so that the functions and modules it
calls can still be compiled (``kiln``'s regional compilation).

``with_redirected_globals(fn, redirect)`` is a copy of ``fn`` (same globals, defaults,
closure and name) whose every ``LOAD_GLOBAL name`` is followed by a call of
``redirect(value)``: the value the code goes on with. Everything else is ``fn``'s own
bytecode, so the function behaves as ``fn`` does wherever ``redirect`` returns the value it
is given; a global is read at each use, as before, so rebinding it takes effect.
"""

from __future__ import annotations

import functools
import types

from bytecode import Bytecode, Instr

from kiln_capture import versions
from kiln_capture.codegen import function_over


def global_names(fn: types.FunctionType) -> list[str]:
    """The global names ``fn``'s code reads, in order of first use."""
    names: list[str] = []
    for item in Bytecode.from_code(fn.__code__):
        if isinstance(item, Instr) and item.name == "LOAD_GLOBAL":
            name = item.arg[1] if isinstance(item.arg, tuple) else item.arg
            if name not in names:
                names.append(name)
    return names


def with_redirected_globals(fn: types.FunctionType, redirect) -> types.FunctionType:
    """``fn`` with each global it reads passed through ``redirect(value)`` first."""
    original = Bytecode.from_code(fn.__code__, conserve_exception_block_stackdepth=True)
    items = []
    for item in original:
        if isinstance(item, Instr) and item.name == "LOAD_GLOBAL":
            items.extend(redirected_load(item, redirect))
        else:
            items.append(item)
    rewritten = Bytecode(items)
    rewritten._copy_attr_from(original)
    new = function_over(fn, rewritten.to_code(), fn.__name__)
    functools.update_wrapper(new, fn)
    return new


def redirected_load(inst: Instr, redirect) -> list[Instr]:
    """``LOAD_GLOBAL name`` as ``redirect(<the global>)``, with the NULL the original pushes
    for a call where it pushes it."""
    push_null, name = inst.arg if isinstance(inst.arg, tuple) else (False, inst.arg)
    at = inst.location
    load = Instr("LOAD_GLOBAL", (False, name), location=at)
    call = [Instr(i.name, i.arg, location=at) for i in versions.call_instrs(1)]
    if versions.null_before_callable():
        null = [Instr("PUSH_NULL", location=at)] if push_null else []
        return [
            *null,
            Instr("PUSH_NULL", location=at),
            Instr("LOAD_CONST", redirect, location=at),
            load,
            *call,
        ]
    null = [Instr("PUSH_NULL", location=at)] if push_null else []
    return [
        Instr("LOAD_CONST", redirect, location=at),
        Instr("PUSH_NULL", location=at),
        load,
        *call,
        *null,
    ]
