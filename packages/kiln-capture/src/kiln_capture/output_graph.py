"""The graph being built for one captured frame: its FX graph, fake tensors, inputs, guards
and side effects, and what turns it into a compiled callable."""

from __future__ import annotations

import contextlib
import operator
import re

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from kiln_capture.dynamic_shapes import DynamicSizes
from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.fake_memo import FakeMemo, states, tensor_arguments
from kiln_capture.fake_results import meta_errors_unlogged, run_fake
from kiln_capture.guards import GuardSet
from kiln_capture.side_effects import SideEffects
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import SequenceVariable, SliceVariable
from kiln_capture.variables.tensor import SymNodeVariable, TensorVariable


def placeholder_name(source) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", source.expr().replace("___G", "G"))
    return "L_" + name.strip("_")


class OutputGraph:
    def __init__(self, f_globals: dict, closure, dynamic: DynamicSizes):
        self.graph = torch.fx.Graph()
        # the translator whose instruction runs now (innermost inlined call): the nodes it
        # records carry its user's source lines (node.meta["stack_trace"])
        self.current = None
        # an op whose output shape depends on data (nonzero, a boolean mask, unique) breaks
        # the graph, as .item() does: it runs between two compiled graphs
        self.shape_env = ShapeEnv(allow_dynamic_output_shape_ops=False)
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=False)
        self.fake_memo = FakeMemo(self.fake_mode)  # a repeated layer's calls, run once
        self.guards = GuardSet(f_globals, closure)
        self.side_effects = SideEffects()
        self.dynamic = dynamic  # which sizes and ints are symbolic
        # the inputs given symbols: expr -> symbolic dims of a tensor ({} for an int)
        self.symbolic_inputs: dict[str, dict] = {}
        self.traced_files: set[str] = set()  # of every function the trace ran (kept_captures)
        self.wrapped: dict = {}  # source -> variable, so a value read twice is one variable
        # id(object) -> its variable, so an object read through two sources is one variable
        self.objects_by_id: dict = {}
        self.inputs: list[tuple[object, torch.Tensor, TensorVariable]] = []
        self.symbolic_contexts: dict[str, object] = {}  # expr -> how its fake was made
        self.reads_storage_offsets = False  # whether code read a tensor's storage offset
        self.input_by_id: dict[int, TensorVariable] = {}
        self.cells: dict[int, Variable] = {}
        self.grad_mode_changes: list[bool] = []
        self.live_contexts: list = []
        self.classes_made: list[type] = []  # by class statements, at capture time
        self.stand_in_cells: list = []  # a class's cells for the frame's (class_statements)
        self.initial_grad_mode = torch.is_grad_enabled()

    # --- inputs -----------------------------------------------------------------

    def add_input(self, value: torch.Tensor, source) -> TensorVariable:
        existing = self.input_by_id.get(id(value))
        if existing is not None:
            self.guards.same_object(source, existing.source)
            return existing
        from kiln_capture.sources import reads_module_state

        is_state = isinstance(value, torch.nn.Parameter) or reads_module_state(source)
        dims = self.dynamic.tensor_dims(source.expr(), value, is_state)
        if dims:
            self.symbolic_inputs[source.expr()] = dims
        self.guards.tensor(source, value, dims)
        fake = self.fake_from_real(value, source, dims)
        node = self.graph.placeholder(self.unique_name(placeholder_name(source)))
        node.meta["source"] = source.expr()
        variable = TensorVariable(node, fake, type(value), source)
        variable.real = value  # for attribute lookups only; the graph never sees it
        self.inputs.append((source, value, variable))
        self.input_by_id[id(value)] = variable
        return variable

    def add_int_input(self, value: int, source) -> SymNodeVariable:
        """An int argument made symbolic (it changed between calls): a graph input."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        from kiln_capture.guards import ShapeSource

        expr = self.guards.bind(source)
        self.guards.add(f"type({expr}) is int", f"{expr} is an int (dynamic)")
        symbol = self.shape_env.create_unspecified_symint_and_symbol(
            value, ShapeSource(expr), DimDynamic.DYNAMIC
        )
        node = self.graph.placeholder(self.unique_name(placeholder_name(source)))
        node.meta["source"] = expr
        variable = SymNodeVariable(node, symbol)
        self.inputs.append((source, value, variable))
        self.symbolic_inputs[expr] = {}
        return variable

    def fake_from_real(self, value: torch.Tensor, source, dims: dict) -> torch.Tensor:
        if not dims:
            return self.fake_mode.from_tensor(value, static_shapes=True)
        from kiln_capture.guards import ShapeSource

        context = symbolic_context(value, dims)
        self.symbolic_contexts[source.expr()] = context
        return self.fake_mode.from_tensor(
            value, source=ShapeSource(source.expr()), symbolic_context=context
        )

    def unique_name(self, base: str) -> str:
        names = {n.name for n in self.graph.nodes}
        name, i = base, 1
        while name in names:
            name, i = f"{base}_{i}", i + 1
        return name

    def cell_for(self, real_cell, source):
        from kiln_capture.variables.functions import CellVariable

        key = id(real_cell)
        if key not in self.cells:
            self.cells[key] = CellVariable(real_cell=real_cell, source=source)
        return self.cells[key]

    # --- nodes ------------------------------------------------------------------

    def call_graph(self, kind: str, target, args: list[Variable], kwargs: dict) -> Variable:
        """Record ``target(*args, **kwargs)`` and run it on fake tensors for its result."""
        node_args = tuple(as_node_arg(a) for a in args)
        node_kwargs = {k: as_node_arg(v) for k, v in kwargs.items()}
        fake_args = tuple(as_fake_arg(a) for a in args)
        fake_kwargs = {k: as_fake_arg(v) for k, v in kwargs.items()}
        memo_key, tensors = None, []
        if not self.symbolic_inputs:  # sizes are symbolic: every call runs
            memo_key = self.fake_memo.key(kind, target, fake_args, fake_kwargs)
        if memo_key is not None:
            tensors = tensor_arguments(fake_args, fake_kwargs)
        result = self.fake_memo.recall(memo_key, tensors)
        if result is None:
            result = self.fake_result(kind, target, fake_args, fake_kwargs, memo_key, tensors)
        node = self.graph.create_node(kind, target, node_args, node_kwargs)
        if self.current is not None:
            node.meta["stack_trace"] = self.current.stack_trace()
        for arg in args:  # an in-place op returns its input: the same variable, so `is` holds
            if isinstance(arg, TensorVariable) and arg.example is result:
                return arg
        return self.wrap_result(node, result)

    def fake_result(self, kind, target, fake_args, fake_kwargs, memo_key, tensors):
        """``target`` run on fake tensors; its result is remembered under ``memo_key``
        (``tensors``: the fake tensors among the arguments)."""
        before = states(tensors)
        try:
            with self.fake_mode, self.symbolic_dispatch(), meta_errors_unlogged():
                result = run_fake(kind, target, fake_args, fake_kwargs)
        except torch._subclasses.fake_tensor.DynamicOutputShapeException as exc:
            raise GraphBreak(
                f"{describe_target(target)} has a data-dependent output shape",
                data_dependent=True,
            ) from exc
        except torch._subclasses.fake_tensor.DataDependentOutputException as exc:
            raise GraphBreak(
                f"{describe_target(target)} needs a tensor's data", data_dependent=True
            ) from exc
        except torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode as exc:
            raise GraphBreak(f"{describe_target(target)} branches on a tensor's data") from exc
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            if "meta" in str(exc) and "not implemented" in str(exc).lower():
                raise GraphBreak(f"{describe_target(target)} has no fake implementation") from exc
            raise UserError(exc) from None
        self.fake_memo.remember(memo_key, result, tensors, before)
        return result

    def symbolic_dispatch(self):
        """Where sizes are symbolic, ops run through torch's Python decompositions: the C++
        composites of some (``upsample_nearest1d.vec``, the kernel of ``F.interpolate``)
        take concrete sizes only, or fix the symbolic ones they are given with guards."""
        if not self.symbolic_inputs:
            return contextlib.nullcontext()
        return enable_python_dispatcher()

    def wrap_result(self, node, result) -> Variable:
        from kiln_capture.variables.builder import wrap_derived
        from kiln_capture.variables.containers import NamedTupleVariable, TupleVariable

        if isinstance(result, torch.Tensor):
            return TensorVariable(node, result, torch.Tensor)
        if isinstance(result, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            if result.node.expr.is_number:
                return ConstantVariable(result.node.pytype(result.node.expr))
            return SymNodeVariable(node, result)
        if isinstance(result, (tuple, list)) and any(
            isinstance(r, (torch.Tensor, torch.SymInt)) for r in result
        ):
            items = []
            for i, item in enumerate(result):
                item_node = self.graph.call_function(operator.getitem, (node, i))
                if "stack_trace" in node.meta:
                    item_node.meta["stack_trace"] = node.meta["stack_trace"]
                items.append(self.wrap_result(item_node, item))
            if hasattr(type(result), "_fields") or hasattr(type(result), "n_fields"):
                return NamedTupleVariable(items, type(result))
            return TupleVariable(items) if isinstance(result, tuple) else _list(items)
        if result is None:
            return ConstantVariable(None)
        if isinstance(result, (bool, int, float, torch.dtype, torch.device, torch.Size)):
            node.graph.erase_node(node)  # a metadata query: its answer is fixed by the guards
            return wrap_derived(None, result)
        raise GraphBreak(f"{describe_target(node.target)} returned a {type(result).__name__}")

    def evaluate_symbolic(self, value):
        return self.shape_env.evaluate_expr(value.node.expr)

    def has_ops(self) -> bool:
        return any(n.op not in ("placeholder", "output") for n in self.graph.nodes)

    @contextlib.contextmanager
    def tracing_state(self):
        """Global state the trace changes (grad mode, autocast) is restored afterwards."""
        try:
            yield
        finally:
            for context in reversed(self.live_contexts):
                context.__exit__(None, None, None)
            self.live_contexts.clear()
            torch._C._set_grad_enabled(self.initial_grad_mode)


def symbolic_context(value: torch.Tensor, dims: dict):
    """How torch's fake tensors make ``value``'s symbolic dimensions. A dimension the user
    marked (dims[d] is its (min, max)) is constrained: to its range (the guards check it),
    and to stay symbolic (the guards say where the code fixes it)."""
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        RelaxedUnspecConstraint,
        StatelessSymbolicContext,
        StrictMinMaxConstraint,
    )
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    def constraint(d):
        if dims.get(d) is None:
            return None
        low, high = dims[d]
        if low is None and high is None:
            return RelaxedUnspecConstraint(warn_only=False)
        return StrictMinMaxConstraint(
            vr=ValueRanges(0 if low is None else low, int_oo if high is None else high),
            warn_only=False,
        )

    return StatelessSymbolicContext(
        dynamic_sizes=[
            DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(value.dim())
        ],
        constraint_sizes=[constraint(d) for d in range(value.dim())],
    )


def _list(items):
    from kiln_capture.variables.containers import ListVariable

    return ListVariable(items)


def describe_target(target) -> str:
    if isinstance(target, str):
        return f"Tensor.{target}"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", str(target))


def as_node_arg(v):
    if isinstance(v, (TensorVariable, SymNodeVariable)):
        return v.node
    if isinstance(v, SliceVariable):
        return slice(*(as_node_arg(p) for p in v.parts))
    if isinstance(v, SequenceVariable):
        return (
            v.python_cls(as_node_arg(i) for i in v.items)
            if v.python_cls in (tuple, list)
            else tuple(as_node_arg(i) for i in v.items)
        )
    if isinstance(v, ConstantVariable):
        return v.value
    if isinstance(v, Variable):
        from kiln_capture.variables.containers import DictVariable

        if isinstance(v, DictVariable):
            return {k: as_node_arg(val) for k, (_, val) in v.entries.items()}
        raise GraphBreak(f"{v.describe()} as an argument of a tensor operation")
    return v


def as_fake_arg(v):
    if isinstance(v, (TensorVariable, SymNodeVariable)):
        return v.example
    if isinstance(v, SliceVariable):
        return slice(*(as_fake_arg(p) for p in v.parts))
    if isinstance(v, SequenceVariable):
        items = [as_fake_arg(i) for i in v.items]
        return list(items) if v.python_cls is list else tuple(items)
    if isinstance(v, ConstantVariable):
        return v.value
    from kiln_capture.variables.containers import DictVariable

    if isinstance(v, DictVariable):
        return {k: as_fake_arg(val) for k, (_, val) in v.entries.items()}
    raise GraphBreak(f"{v.describe()} as an argument of a tensor operation")
