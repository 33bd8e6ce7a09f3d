"""``class`` statements inside a captured frame.

``LOAD_BUILD_CLASS`` pushes ``builtins.__build_class__``; calling it with the class body
(a function made in the frame) makes the class. Where the body only defines things —
functions, constants, annotations, the decorators of the standard library — and the bases
are classes that run no code of the user's when subclassed, the class is made once, at
capture time, and the rest of the frame (instances, method calls) is traced as for any
class. Anything else breaks the graph at the class statement, which then runs natively.

The class is one object per capture rather than one per call: nothing a plain body
defines can tell the two apart, except the class's identity across calls.

A class whose methods read variables of the enclosing function (a closure) is made over
cells of its own, one per variable, which capture maps to the frame's cells: a method
traced during the call reads and writes the frame's variables, as it does eagerly. The body
itself may read an enclosing variable that holds a constant (``size = n``), which the class
keeps. Such a class stays inside the frame: the code generated after the graph refuses to
hand it (or an instance of it) out, since its methods could not reach a later call's cells.
"""

from __future__ import annotations

import builtins
import dis
import types
import weakref

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import Variable
from kiln_capture.variables.functions import NestedFunctionVariable


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# What a body made of definitions compiles to (CPython 3.11 to 3.13).
DEFINITION_OPS = _names("""RESUME NOP CACHE EXTENDED_ARG LOAD_NAME STORE_NAME LOAD_CONST
RETURN_VALUE RETURN_CONST MAKE_FUNCTION SET_FUNCTION_ATTRIBUTE LOAD_CLOSURE MAKE_CELL
COPY_FREE_VARS LOAD_CLASSDEREF LOAD_FROM_DICT_OR_DEREF LOAD_DEREF BUILD_TUPLE COPY POP_TOP
PUSH_NULL PRECALL CALL LOAD_ATTR LOAD_METHOD SETUP_ANNOTATIONS STORE_SUBSCR LOAD_LOCALS
LOAD_FROM_DICT_OR_GLOBALS""")
# The builtins a body may name (decorators, annotations).
BUILTIN_NAMES = _names("""staticmethod classmethod property int float bool str bytes complex
list tuple dict set frozenset object type None""")
# Modules whose classes and functions a body may use (annotations, decorators, bases).
LIBRARY_MODULES = ("torch", "typing", "dataclasses", "functools", "abc", "builtins", "enum")
# Classes made over cells of their own that stand for a frame's (see the module docstring).
CLASSES_OVER_FRAME_CELLS: weakref.WeakSet = weakref.WeakSet()


class BuildClassVariable(Variable):
    """``builtins.__build_class__``, as ``LOAD_BUILD_CLASS`` pushes it."""

    def python_type(self):
        return types.BuiltinFunctionType

    def describe(self) -> str:
        return "a class statement"

    def call(self, tx, args, kwargs):
        from kiln_capture.variables.builder import wrap_derived

        if len(args) < 2 or not isinstance(args[0], NestedFunctionVariable):
            raise GraphBreak("a class statement of an unusual form")
        body, name, bases = args[0], args[1].as_constant(), args[2:]
        why = why_not_at_capture_time(body, bases, kwargs, tx.output.classes_made)
        if why is not None:
            raise GraphBreak(f"class {name}: {why}")
        cells = stand_in_cells(tx, body)
        function = types.FunctionType(
            body.code_object, body.globals_dict, body.qualname, None, cells
        )
        real_bases = [b.value for b in bases]
        keywords = {k: v.as_constant() for k, v in kwargs.items()}
        cls = tx.run_user_code(builtins.__build_class__, function, name, *real_bases, **keywords)
        tx.output.classes_made.append(cls)
        if cells:
            CLASSES_OVER_FRAME_CELLS.add(cls)
        return wrap_derived(tx, cls)

    def reconstruct(self, cg) -> None:
        cg.load_const(builtins.__build_class__)


def why_not_at_capture_time(
    body: NestedFunctionVariable, bases, kwargs, classes_made: list
) -> str | None:
    """Why the class cannot be made once at capture time (None: it can). Its bases are
    library classes or classes made at capture time too."""
    from kiln_capture.variables.objects import ClassVariable

    if body.defaults is not None or body.kwdefaults is not None:
        return "a class body with defaults"
    if kwargs:
        return "a metaclass or class keywords"
    for base in bases:
        if not isinstance(base, ClassVariable) or not (
            is_library_class(base.value) or any(base.value is c for c in classes_made)
        ):
            return f"base {base.describe()} is a class of the user's, made outside the frame"
    return why_not_plain_body(body.code_object, body.globals_dict)


def stand_in_cells(tx, body: NestedFunctionVariable) -> tuple | None:
    """Cells for the class body's free variables, each mapped to the frame's cell it stands
    for (``tx.output.cell_for`` finds the frame's cell from it); a cell the body reads
    itself holds the frame cell's value, which must be a constant."""
    from kiln_capture.variables.functions import real_value

    if not body.closure:
        return None
    read = {
        inst.argval
        for inst in dis.get_instructions(body.code_object)
        if inst.opname in ("LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF", "LOAD_DEREF")
    }
    cells = []
    for name, frame_cell in zip(body.code_object.co_freevars, body.closure, strict=True):
        cell = types.CellType()
        if name in read:
            value = real_value(frame_cell.load(tx))
            if value is None:
                raise GraphBreak(
                    f"class {body.qualname}: its body reads {name}, which is not a constant"
                )
            cell.cell_contents = value[0]
        tx.output.cells[id(cell)] = frame_cell
        tx.output.stand_in_cells.append(cell)  # alive while ids key tx.output.cells
        cells.append(cell)
    return tuple(cells)


def refuse_escaping_class(value) -> None:
    """Raise where generated code would hand out a class made over stand-in cells."""
    if isinstance(value, type) and value in CLASSES_OVER_FRAME_CELLS:
        from kiln_capture.exc import CaptureFailed

        raise CaptureFailed(
            f"class {value.__qualname__} reads variables of the enclosing function and "
            f"leaves the frame (returned or stored), so each call must make its own"
        )


def why_not_plain_body(code: types.CodeType, f_globals: dict) -> str | None:
    """Why running the body is not just defining names (None: it is)."""
    stored = set()
    for inst in dis.get_instructions(code):
        if inst.opname not in DEFINITION_OPS:
            return f"its body runs {inst.opname} (only definitions are made at capture time)"
        if inst.opname == "STORE_NAME":
            stored.add(inst.argval)
    for inst in dis.get_instructions(code):
        if inst.opname != "LOAD_NAME" or inst.argval in stored:
            continue
        if inst.argval in ("__name__", "__annotations__") or inst.argval in BUILTIN_NAMES:
            continue
        if not is_library_value(f_globals.get(inst.argval)):
            return f"its body reads {inst.argval}, which is not a library module or class"
    return None


def is_library_class(cls) -> bool:
    return isinstance(cls, type) and (
        cls is object or (cls.__module__ or "").split(".")[0] in LIBRARY_MODULES
    )


def is_library_value(value) -> bool:
    if isinstance(value, types.ModuleType):
        return value.__name__.split(".")[0] in LIBRARY_MODULES
    module = getattr(value, "__module__", None) or ""
    return module.split(".")[0] in LIBRARY_MODULES
