"""Lowering: a functional aten FX graph -> a :class:`~kiln_loopir.ir.LoopGraph`.

Each FX node is lowered through the registry (``registry.py``), filled by the modules that
own the ops: ``pointwise``, ``reductions``, ``matmul``, ``views``, ``indexing``,
``pooling``, ``random`` and ``extern``. An op with no lowering runs eagerly through ATen
(``extern.fallback``), which logs it once per op.
"""

from __future__ import annotations

import logging
import operator

import sympy
import torch
import torch.fx

from kiln_loopir.ir import Buffer, ExternNode, GraphInput, LoopGraph, TensorRef
from kiln_loopir.lowering import (
    bucketing,
    extern,
    indexing,
    matmul,
    pointwise,
    pooling,
    random,
    reductions,
    scans,
    views,
)
from kiln_loopir.lowering.context import LoweringContext, val_layout
from kiln_loopir.lowering.registry import (
    LOWERINGS,
    find_lowering,
    is_view_op,
    lowered_ops,
    register_lowering,
)
from kiln_loopir.runtime import view_layout
from kiln_loopir.symbols import data_dependent_symbols, is_data_dependent, to_expr

__all__ = ["lower", "register_lowering", "find_lowering", "lowered_ops", "LOWERINGS"]
_ = (
    bucketing,
    indexing,
    matmul,
    pointwise,
    pooling,
    random,
    reductions,
    scans,
)  # imported for their registrations
aten = torch.ops.aten
log = logging.getLogger("kiln.loopir")


def _meta(node: torch.fx.Node, example: object = None) -> object:
    val = node.meta.get("val", node.meta.get("example_value"))
    return example if val is None else val


def _size_hints(graph_inputs, vals, example_inputs) -> dict[sympy.Symbol, int]:
    hints: dict[sympy.Symbol, int] = {}
    for val, example in zip(vals, example_inputs or [None] * len(vals), strict=False):
        if isinstance(val, torch.Tensor):
            shape_env = getattr(getattr(val, "fake_mode", None), "shape_env", None)
            if shape_env is not None:
                backed = getattr(shape_env, "backed_var_to_val", None)
                for sym, hint in (backed if backed is not None else shape_env.var_to_val).items():
                    hints.setdefault(sym, int(hint))
            if isinstance(example, torch.Tensor):
                pairs = list(zip(val.shape, example.shape, strict=False))
                pairs += list(zip(val.stride(), example.stride(), strict=False))
                for s, real in pairs:
                    e = to_expr(s)
                    # a symbolic example (the value itself) has no size to read: int() of
                    # it would specialize the symbol in its ShapeEnv
                    if isinstance(e, sympy.Symbol) and not isinstance(real, torch.SymInt):
                        hints[e] = int(real)
        elif isinstance(val, torch.SymInt):
            e = to_expr(val)
            if isinstance(e, sympy.Symbol) and isinstance(example, int):
                hints[e] = example
    return hints


def _live_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    live: set[torch.fx.Node] = set()
    stack = [n for n in gm.graph.nodes if n.op == "output"]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    return live


def lower(
    gm: torch.fx.GraphModule,
    example_inputs: list | None = None,
    *,
    scans: bool = False,
    masked_strided_reads: bool = True,
) -> LoopGraph:
    """Lower ``gm`` (aten ops, fake-tensor ``meta["val"]`` on every node) to a LoopGraph.

    ``scans``: whether the code generator renders Scan nodes (``renders_scans``); without
    them cumulative ops are prefix reductions along short dimensions, else ATen calls.
    ``masked_strided_reads``: whether it vectorises reads under a mask at a step
    (``vectorises_masked_strided_reads``); without them a producer read so is not inlined."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = list(example_inputs) if example_inputs is not None else [None] * len(placeholders)
    if len(examples) != len(placeholders):
        raise ValueError(
            f"the graph has {len(placeholders)} inputs but {len(examples)} example inputs "
            "were given: pass one example per placeholder"
        )
    inputs: list[GraphInput] = []
    env: dict[torch.fx.Node, object] = {}
    vals = []
    for node, example in zip(placeholders, examples, strict=True):
        val = _meta(node, example)
        vals.append(val)
        if isinstance(val, torch.Tensor):
            size, stride, _ = val_layout(val)
            buf = Buffer(node.name, val.dtype, val.device, size, stride)
            inputs.append(GraphInput(node.name, buffer=buf))
            env[node] = buf.ref()
        elif isinstance(val, torch.SymInt):
            inputs.append(GraphInput(node.name, expr=to_expr(val)))
            env[node] = to_expr(val)
        else:
            inputs.append(GraphInput(node.name, value=val))
            env[node] = val
    graph = LoopGraph(inputs, size_hints=_size_hints(inputs, vals, example_inputs))
    ctx = LoweringContext(graph)
    ctx.graph_device = _graph_device(gm, vals)
    ctx.scans = scans
    ctx.masked_strided_reads = masked_strided_reads
    live = _live_nodes(gm)
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node in live:
            env[node] = _constant(graph, gm, node)
        if node.op != "call_function" or node not in live:
            continue
        env[node] = _lower_node(ctx, node, env)
        made = env[node]
        if isinstance(made, TensorRef) and made.buffer not in ctx.readers:
            ctx.readers[made.buffer] = _readers(node)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = torch.fx.node.map_arg(out_node.args[0], lambda n: env[n])
    graph.outputs = _flatten(results)
    if any(isinstance(o, pointwise.NumberRef) for o in graph.outputs):
        raise NotImplementedError(
            "the graph returns a float read from tensor data (.item()): kiln-loopir returns "
            "only tensors and sizes; run this graph eagerly"
        )
    return graph


def _readers(node: torch.fx.Node) -> int:
    """How many ops read ``node``'s result, through views (a view reads nothing itself);
    the graph's output counts as one."""
    count = 0
    for user in node.users:
        if user.op == "call_function" and is_view_op(user.target):
            count += _readers(user)
        else:
            count += 1
    return count


def _graph_device(gm: torch.fx.GraphModule, vals: list[object]) -> torch.device:
    """The device the kernels run on: the inputs' (else the first tensor's); as
    ``compile_fx`` picks its codegen."""
    for val in [*vals, *(_meta(n) for n in gm.graph.nodes)]:
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def _on_other_device(val: object, device: torch.device) -> bool:
    return any(t.device != device for t in _tensors(val))


def _constant(graph: LoopGraph, gm: torch.fx.GraphModule, node: torch.fx.Node) -> object:
    value: object = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        return value
    size, stride, _ = val_layout(value)
    buf = Buffer(node.name, value.dtype, value.device, size, stride)
    graph.constants.append(GraphInput(node.name, buffer=buf, value=value))
    return buf.ref()


def _is_empty(val: object) -> bool:
    return isinstance(val, torch.Tensor) and any(isinstance(n, int) and n == 0 for n in val.shape)


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _lowerable_dtypes(val: object, arg_vals: tuple) -> bool:
    outs, ins = _tensors(val), _tensors(list(arg_vals))
    if any(t.dtype.is_complex for t in outs + ins):
        return False
    return not (ins and outs and is_view_op_dtype_change(ins[0], outs))


def is_view_op_dtype_change(first_in: torch.Tensor, outs: list[torch.Tensor]) -> bool:
    return any(o.dtype != first_in.dtype and _same_storage(o, first_in) for o in outs)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except Exception:
        return False


def _flatten(value: object) -> list[object]:
    if isinstance(value, (tuple, list)):
        return [y for x in value for y in _flatten(x)]
    return [value]


# ops whose result is a number read from tensor data (a SymInt/SymFloat with no hint)
_READS_TENSOR_DATA = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


# ops whose lowerings read every operand through ``pointwise.loader``: a float read from
# tensor data (a NumberRef) may be one of their operands
_FLOAT_OPERAND_OPS = {
    aten.add, aten.sub, aten.rsub, aten.mul, aten.div, aten.maximum, aten.minimum,
    *pointwise.COMPARISON,
}  # fmt: skip


def _read_number(ctx: LoweringContext, node: torch.fx.Node, env: dict) -> object:
    """``u0 = t.item()``: an extern step that binds the symbol in the host program, which
    passes it to the kernels as a size argument. A float read is loaded by the kernels that
    use it from the tensor itself (a NumberRef)."""
    val, source = _meta(node), env[node.args[0]]
    float_read = isinstance(val, torch.SymFloat) and is_data_dependent(val.node.expr)
    if float_read and isinstance(source, TensorRef):
        return pointwise.NumberRef(
            source.buffer, source.dtype, source.device, (), (), source.offset
        )
    symbol = to_expr(val) if isinstance(val, torch.SymInt) else None
    if not is_data_dependent(symbol) or not isinstance(source, TensorRef):
        what = type(val).__name__
        log.info("%s = %s reads a %s from tensor data: the graph is refused", node.name,
                 node.target, what)  # fmt: skip
        raise NotImplementedError(
            f"{node.name} = {node.target}(...) reads a {what} from tensor data (.item() of "
            f"a {getattr(_meta(node.args[0]), 'dtype', '?')} tensor): kiln-loopir passes only "
            "integers and floats read from tensor data to its kernels; run this graph "
            "eagerly, or "
            "break the graph before the read (kiln-capture does unless told to capture "
            "scalar outputs)"
        )
    read = torch.ops.aten._local_scalar_dense.default
    ctx.graph.nodes.append(ExternNode(read, (source,), {}, [], binds=[(symbol, "")]))
    return symbol


def _float_reads(expr: object) -> bool:
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    free = sympy.sympify(expr).free_symbols
    return any(symbol_is_type(s, SymT.UNBACKED_FLOAT) for s in free)


def _float_read_use(node: torch.fx.Node) -> str:
    log.info("%s = %s uses a float read from tensor data: the graph is refused", node.name,
             node.target)  # fmt: skip
    return (
        f"{node.name} = {node.target}(...) uses a float read from tensor data (.item()) "
        "other than as an operand of pointwise add, sub, mul, div, maximum, minimum or a "
        "comparison: kiln-loopir cannot pass it there; run this graph eagerly, or break "
        "the graph before the read"
    )


def _bound_symbols(graph: LoopGraph) -> set[sympy.Symbol]:
    bound: set[sympy.Symbol] = set()
    for node in graph.nodes:
        if isinstance(node, ExternNode):
            bound |= node.bound_symbols()
    return bound


def _fresh_symbols(ctx: LoweringContext) -> set[sympy.Symbol]:
    """The data-dependent symbols of the result's layout that no step binds yet."""
    if not isinstance(ctx.val, torch.Tensor):
        return set()
    size, stride, offset = val_layout(ctx.val)
    fresh = data_dependent_symbols([*size, *stride, offset])
    return fresh - _bound_symbols(ctx.graph) if fresh else fresh


def _bind_view_symbols(ctx: LoweringContext, base: object, args: tuple, kwargs: dict) -> None:
    """A view bounded by a number read from tensor data (``x[: n.item()]``) gets fresh
    size (or offset) symbols from the tracer: bind them in the host program by working the
    view out on a meta tensor (``view_layout``)."""
    fresh = _fresh_symbols(ctx)
    if not fresh:
        return
    size, stride, offset = val_layout(ctx.val)
    places = {e: f"[0][{d}]" for d, e in reversed(list(enumerate(size)))}
    places |= {e: f"[1][{d}]" for d, e in reversed(list(enumerate(stride))) if e not in places}
    places.setdefault(offset, "[2]")
    if not isinstance(base, TensorRef) or any(s not in places for s in fresh):
        raise NotImplementedError(
            f"the layout of {ctx.op}'s result, {size} stride {stride} offset {offset}, has "
            "sizes from tensor data the host program cannot work out"
        )
    base_layout = val_layout(ctx.arg_vals[0])
    binds = [(s, places[s]) for s in sorted(fresh, key=str)]
    node = ExternNode(view_layout, (ctx.op, *base_layout, *args), dict(kwargs), [], binds=binds)
    ctx.graph.nodes.append(node)


def _origin(node: torch.fx.Node) -> str:
    """The op an FX node stands for: the op it was decomposed from where tracing recorded
    one (``meta["original_aten"]``, see :func:`kiln_loopir.decompose`), else its own."""
    op = node.meta.get("original_aten") or node.target
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(op)
    return getattr(op, "__name__", str(op))


def _lower_node(ctx: LoweringContext, node: torch.fx.Node, env: dict) -> object:
    val = _meta(node)
    if node.target is operator.getitem:
        return env[node.args[0]][node.args[1]]
    if node.target in _READS_TENSOR_DATA:
        return _read_number(ctx, node, env)
    if isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)) and _float_reads(
        val.node.expr
    ):
        raise NotImplementedError(_float_read_use(node))
    if isinstance(val, torch.SymInt):
        return to_expr(val)
    if isinstance(val, (torch.SymBool, torch.SymFloat)):
        return val.node.expr  # a size condition or ratio: kept symbolic
    if val is None and node.target is not operator.getitem:
        # runtime assertions on sizes (aten._assert_scalar ...): the tracer's shape
        # environment already holds them as guards
        return None
    if isinstance(val, (int, float, bool)) and not isinstance(node.target, torch._ops.OpOverload):
        return val  # Python arithmetic on sizes, already folded by the tracer
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    reads_float = any(
        isinstance(a, pointwise.NumberRef) for a in _flatten([args, list(kwargs.values())])
    )
    if reads_float and getattr(node.target, "overloadpacket", None) not in _FLOAT_OPERAND_OPS:
        raise NotImplementedError(_float_read_use(node))
    ctx.val, ctx.op, ctx.kwargs = val, node.target, kwargs
    ctx.origin, ctx.inlined_origins = _origin(node), []
    ctx.inlined_now = False
    ctx.arg_vals = tuple(_meta(a) if isinstance(a, torch.fx.Node) else a for a in node.args)
    ctx.kwarg_vals = {
        k: _meta(a) if isinstance(a, torch.fx.Node) else a for k, a in node.kwargs.items()
    }
    if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
        raise ValueError(
            f"{node.name} = {node.target}(...) mutates an input, but kiln-loopir takes "
            "functional graphs: functionalize the graph first (torch.func.functionalize, as "
            "kiln-autograd does)"
        )
    fn = find_lowering(node.target)
    if fn is None and is_view_op(node.target):
        fn = views.lower_view
    if fn is None and views.view_of_copy_op(node.target) is not None:
        fn = views.lower_view_copy
    if fn is not None and not _lowerable_dtypes(val, ctx.arg_vals):
        fn = None  # complex numbers and dtype-changing views run through ATen
    if fn is not None and _on_other_device(val, ctx.graph_device):
        # a factory with another device= than the graph's: the graph's codegen cannot
        # run it
        log.info("%s makes a tensor off %s: it runs through ATen", node.target, ctx.graph_device)
        fn = None
    if fn is not None and fn is not views.lower_view and _is_empty(val):
        # nothing to compute: an empty buffer with the result's layout
        return ctx.pointwise(lambda ops, index: ops.constant(0, val.dtype))
    if fn is views.lower_view:
        _bind_view_symbols(ctx, args[0] if args else None, args[1:], kwargs)
    if fn is views.lower_view_copy and _fresh_symbols(ctx):
        raise NotImplementedError(
            f"{node.name} = {node.target}(...) copies a view sized by a number read from "
            "tensor data: trace with views kept (functionalize(remove='mutations'))"
        )
    if fn is None and reads_float:  # ATen would take the float as a 0-d tensor
        raise NotImplementedError(_float_read_use(node))
    if fn is None:
        return extern.fallback(ctx, *args, **kwargs)
    try:
        return fn(ctx, *args, **kwargs)
    except NotImplementedError as exc:
        if reads_float:
            raise NotImplementedError(_float_read_use(node)) from exc
        log.info("lowering of %s gave up (%s): falling back to ATen", node.target, exc)
        return extern.fallback(ctx, *args, **kwargs)
