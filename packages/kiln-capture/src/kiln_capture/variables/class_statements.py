"""``class`` statements inside a captured frame.

``LOAD_BUILD_CLASS`` pushes ``builtins.__build_class__``; calling it with the class body
(a function made in the frame) makes the class. Where the body only defines things —
functions, constants, annotations, the decorators of the standard library — and the bases
are classes that run no code of the user's when subclassed, the class is made once, at
capture time, and the rest of the frame (instances, method calls) is traced as for any
class. Anything else breaks the graph at the class statement, which then runs natively.

The class is one object per capture rather than one per call: nothing a plain body
defines can tell the two apart, except the class's identity across calls.
"""

from __future__ import annotations

import builtins
import dis
import types

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import Variable
from kiln_capture.variables.functions import NestedFunctionVariable


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# What a body made of definitions compiles to (CPython 3.11 to 3.13).
DEFINITION_OPS = _names("""RESUME NOP CACHE EXTENDED_ARG LOAD_NAME STORE_NAME LOAD_CONST
RETURN_VALUE RETURN_CONST MAKE_FUNCTION SET_FUNCTION_ATTRIBUTE LOAD_CLOSURE MAKE_CELL
COPY_FREE_VARS BUILD_TUPLE COPY POP_TOP PUSH_NULL PRECALL CALL LOAD_ATTR LOAD_METHOD
SETUP_ANNOTATIONS STORE_SUBSCR LOAD_LOCALS LOAD_FROM_DICT_OR_GLOBALS""")
# The builtins a body may name (decorators, annotations).
BUILTIN_NAMES = _names("""staticmethod classmethod property int float bool str bytes complex
list tuple dict set frozenset object type None""")
# Modules whose classes and functions a body may use (annotations, decorators, bases).
LIBRARY_MODULES = ("torch", "typing", "dataclasses", "functools", "abc", "builtins", "enum")


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
        function = types.FunctionType(body.code_object, body.globals_dict, body.qualname)
        real_bases = [b.value for b in bases]
        keywords = {k: v.as_constant() for k, v in kwargs.items()}
        cls = tx.run_user_code(builtins.__build_class__, function, name, *real_bases, **keywords)
        tx.output.classes_made.append(cls)
        return wrap_derived(tx, cls)

    def reconstruct(self, cg) -> None:
        cg.load_const(builtins.__build_class__)


def why_not_at_capture_time(
    body: NestedFunctionVariable, bases, kwargs, classes_made: list
) -> str | None:
    """Why the class cannot be made once at capture time (None: it can). Its bases are
    library classes or classes made at capture time too."""
    from kiln_capture.variables.objects import ClassVariable

    if body.closure or body.defaults is not None or body.kwdefaults is not None:
        return "its methods read variables of the enclosing function"
    if kwargs:
        return "a metaclass or class keywords"
    for base in bases:
        if not isinstance(base, ClassVariable) or not (
            is_library_class(base.value) or any(base.value is c for c in classes_made)
        ):
            return f"base {base.describe()} is a class of the user's, made outside the frame"
    return why_not_plain_body(body.code_object, body.globals_dict)


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
