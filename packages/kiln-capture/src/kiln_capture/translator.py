"""The symbolic interpreter: steps through a frame's bytecode with variables on its stack.

One ``Translator`` runs one frame. Calls to Python functions are inlined by a child
translator sharing the same output graph. Opcode handlers live in ``opcodes/`` and are
looked up in the per-version table of ``versions``.
"""

from __future__ import annotations

import inspect
import operator
import types

from kiln_capture import opcodes  # noqa: F401  (fills the handler table)
from kiln_capture.exc import CaptureFailed, GraphBreak, UserError
from kiln_capture.program import Program, load_program
from kiln_capture.sources import GlobalSource, ItemSource, ObjectSource
from kiln_capture.variables.base import NullVariable, Variable
from kiln_capture.variables.builder import wrap
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.versions import HANDLERS

MAX_INLINE_DEPTH = 64
# where each kind of parameter sits in a code object's co_varnames
VARNAMES_ORDER = {
    inspect.Parameter.POSITIONAL_ONLY: 0,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: 0,
    inspect.Parameter.KEYWORD_ONLY: 1,
    inspect.Parameter.VAR_POSITIONAL: 2,
    inspect.Parameter.VAR_KEYWORD: 3,
}


class ReturnValue(Exception):
    def __init__(self, value: Variable):
        self.value = value


class Suspended(Exception):
    """A generator run step by step (a ``@contextmanager``'s) reached a ``yield``."""

    def __init__(self, value: Variable, index: int):
        self.value = value
        self.index = index  # of the YIELD_VALUE: an exception thrown in is raised there


class Translator:
    def __init__(
        self,
        program: Program,
        output,
        f_globals: dict,
        local_vars: dict,
        cells: dict,
        parent: Translator | None = None,
    ):
        self.program = program
        self.output = output
        output.traced_files.add(program.code.co_filename)
        self.f_globals = f_globals
        self.locals = local_vars  # name -> Variable
        self.cells = cells  # name -> CellVariable (cell and free variables)
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.stack: list[Variable] = []
        self.ip = 0
        self.kw_names: tuple[str, ...] = ()
        self.current_index = 0

    @property
    def side_effects(self):
        return self.output.side_effects

    # --- stack ------------------------------------------------------------------

    def push(self, v: Variable) -> None:
        assert isinstance(v, Variable), v
        self.stack.append(v)

    def pop(self) -> Variable:
        return self.stack.pop()

    def popn(self, n: int) -> list[Variable]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def peek(self, depth: int = 1) -> Variable:
        return self.stack[-depth]

    def jump(self, label) -> None:
        self.ip = self.program.target(label)

    # --- running ----------------------------------------------------------------

    def run(self) -> Variable:
        """Run until the frame returns; the returned variable."""
        try:
            while True:
                self.step()
        except ReturnValue as ret:
            return ret.value

    def step(self) -> None:
        index = self.ip
        inst = self.program.instrs[index]
        self.current_index = index
        self.ip = index + 1
        handler = HANDLERS.get(inst.name)
        if handler is None:
            raise GraphBreak(f"opcode {inst.name} is not supported")
        output, previous = self.output, self.output.current
        output.current = self
        try:
            handler(self, inst)
        except UserError as err:
            self.handle_exception(index, err)
        except GraphBreak as brk:
            if brk.inner_where is None:
                from kiln_capture.program import source_line

                brk.inner_where = source_line(self.program, index)
            raise
        except (CaptureFailed, ReturnValue, Suspended):
            raise
        except Exception as exc:
            if not getattr(exc, "__kiln_where__", False):
                exc.__kiln_where__ = True
                exc.add_note(f"while capturing {inst.name} at {self.program.where(index)}")
            raise
        finally:
            output.current = previous

    def stack_trace(self) -> str:
        """The user's lines that run now, outermost call first, as a traceback writes them
        (torch.fx prints the innermost with each node: ``# File: f.py:3 in f, code: ...``)."""
        from kiln_capture.program import traceback_lines

        chain, tx = [], self
        while tx is not None:
            chain.append(tx)
            tx = tx.parent
        return "".join(traceback_lines(t.program, t.current_index) for t in reversed(chain))

    def handle_exception(self, index: int, err: UserError) -> None:
        """Jump to the handler covering instruction ``index``, as CPython would."""
        from kiln_capture.variables.objects import ExceptionVariable

        handler = self.program.handlers[index]
        if handler is None:
            raise err
        del self.stack[handler.stack_depth :]
        if handler.push_lasti:
            self.push(ConstantVariable(index))
        self.push(ExceptionVariable(err.exc))
        self.ip = handler.target

    def where(self) -> str:
        return self.program.where(self.current_index)

    # --- names ------------------------------------------------------------------

    def load_global(self, name: str) -> Variable:
        pending = self.side_effects.pending_global(self.f_globals, name)
        if pending is not None:
            return pending
        if name in self.f_globals:
            source = self.global_source(name)
            return wrap(self, self.f_globals[name], source)
        builtins_dict = self.f_globals.get("__builtins__", __builtins__)
        if isinstance(builtins_dict, types.ModuleType):
            builtins_dict = builtins_dict.__dict__
        if name in builtins_dict:
            source = ItemSource(ObjectSource(builtins_dict, "builtins"), name)
            return wrap(self, builtins_dict[name], source)
        raise UserError(NameError(f"name {name!r} is not defined"))

    def global_source(self, name: str):
        if self.f_globals is self.output.guards.f_globals:
            return GlobalSource(name)
        module = str(self.f_globals.get("__name__", "module")).replace(".", "_")
        return ItemSource(ObjectSource(self.f_globals, f"globals_{module}"), name)

    def store_global(self, name: str, value: Variable) -> None:
        self.side_effects.store_global(self.f_globals, name, value)

    def store_attr(self, obj: Variable, name: str, value: Variable) -> None:
        setter = getattr(obj, "setattr", None)
        if setter is None:
            raise GraphBreak(f"setting attribute {name!r} on {obj.describe()}")
        setter(self, name, value)

    def run_user_code(self, fn, *args, **kwargs):
        """Call real Python code with constant arguments; its exceptions are the user's."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise UserError(exc) from None

    # --- calls ------------------------------------------------------------------

    def call(self, fn: Variable, args: list[Variable], kwargs: dict) -> Variable:
        return fn.call(self, args, kwargs)

    def inline_call(self, fn, args: list[Variable], kwargs: dict) -> Variable:
        """Run a Python function's body in a child translator; its return value. A generator
        consumed inside the frame runs to the end: the result iterates over what it yielded."""
        from kiln_capture.variables.containers import ListIteratorVariable

        child = self.child_for(fn, args, kwargs)
        if not child.program.code.co_flags & 0x20:  # not a generator
            return child.run()
        child.yielded = []
        child.run()
        return ListIteratorVariable(child.yielded)

    def child_for(self, fn, args: list[Variable], kwargs: dict) -> Translator:
        """A translator for a call of the Python function ``fn``, ready to run."""
        code = fn.code()
        if code.co_flags & (0x80 | 0x100 | 0x200):
            raise GraphBreak("coroutines and async generators")
        if self.depth >= MAX_INLINE_DEPTH:
            raise GraphBreak("recursion deeper than capture inlines")
        child = Translator(
            load_program(code),
            self.output,
            fn.globals(),
            self.bind_locals(fn, code, args, kwargs),
            fn.closure_cells(self),
            parent=self,
        )
        child.function = fn
        return child

    def bind_locals(self, fn, code, args, kwargs) -> dict:
        """Arguments bound to the callee's parameters, by position in ``co_varnames`` (names
        like a comprehension's ``.0`` are not valid in a signature)."""
        bound = fn.bind(self, args, kwargs)
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
        names = code.co_varnames[:count]
        # co_varnames holds the keyword-only parameters before *args, the signature after
        kinds = {p.name: p.kind for p in bound.signature.parameters.values()}
        values = sorted(bound.arguments.items(), key=lambda item: VARNAMES_ORDER[kinds[item[0]]])
        return {
            name: self.as_variable(value) for name, (_, value) in zip(names, values, strict=True)
        }

    def as_variable(self, value) -> Variable:
        from kiln_capture.variables.containers import DictVariable, TupleVariable

        if isinstance(value, Variable):
            return value
        if isinstance(value, tuple):
            return TupleVariable([self.as_variable(v) for v in value])
        if isinstance(value, dict):
            return DictVariable(
                {k: (ConstantVariable(k), self.as_variable(v)) for k, v in value.items()}
            )
        return wrap(self, value, None)

    def zero_arg_super(self) -> Variable:
        from kiln_capture.variables.objects import SuperVariable

        cell = self.cells.get("__class__")
        code = self.program.code
        if cell is None or code.co_argcount == 0:
            raise GraphBreak("super() outside a method")
        first = code.co_varnames[0]
        self_var = self.locals.get(first)
        if self_var is not None:
            self_var = self.realize_local(first, self_var)
        if self_var is None and first in self.cells:
            self_var = self.cells[first].load(self)
        return SuperVariable(cell.load(self).value, self_var)

    def null(self) -> NullVariable:
        return NullVariable()

    def truth(self, value: Variable) -> bool:
        return value.truthy(self)

    def realize_local(self, name: str, value: Variable) -> Variable:
        """Hook: the root frame wraps its arguments on first use."""
        return value

    def check_return(self) -> None:
        """Hook: the root frame notes that it returned."""

    def setitem(self, obj: Variable, key: Variable, value: Variable) -> None:
        from kiln_capture.variables.tensor import TensorVariable

        if isinstance(obj, TensorVariable):
            self.output.call_graph("call_function", operator.setitem, [obj, key, value], {})
        elif hasattr(obj, "setitem"):
            obj.setitem(self, key, value)
        else:
            obj.call_method(self, "__setitem__", [key, value], {})
