"""``aot``: compile a ``torch.fx.GraphModule`` into a callable that behaves like it under autograd.

:func:`compile_signature` is the whole pipeline for one input signature, step by step.
The stages are public on their own (:func:`trace_joint_graph`,
:func:`trace_inference_graph`, :func:`partition`), so each graph can be printed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx

from kiln_autograd.analyze import analyze
from kiln_autograd.decompositions import decomposition_table, verify_op_set
from kiln_autograd.direct_gradients import eligible_parameters
from kiln_autograd.fake import captured_examples, fake_inputs, is_dynamic
from kiln_autograd.lift import LiftedModule, lift
from kiln_autograd.partition import (
    PARTITIONERS,
    PartitionedGraphs,
    import_min_cut_in_background,
)
from kiln_autograd.records import encode_inference, encode_training
from kiln_autograd.runtime import (
    BackwardAhead,
    Compiler,
    InferenceRunner,
    TrainingRunner,
    example_values,
)
from kiln_autograd.signature_cache import (
    SignatureCache,
    encode_record,
    restore_runner,
    signature_key,
    store_after,
)
from kiln_autograd.static_inputs import (
    captured_state_inputs,
    note_saved_outputs,
    note_static_inputs,
    note_unwritten_state,
)
from kiln_autograd.trace import (
    JointGraph,
    TracedGraph,
    differentiable_outputs,
    trace_inference,
    trace_joint,
)

# Each compiled signature's graphs, as FX Python code, at DEBUG level.
log = logging.getLogger("kiln_autograd")


@dataclasses.dataclass(frozen=True)
class Options:
    """What :func:`aot` was asked for; passed explicitly to every compile."""

    fw_compiler: Compiler
    bw_compiler: Compiler
    decompositions: Mapping | None
    partitioner: str
    dynamic: bool
    cache: SignatureCache | None = None
    direct_gradients: bool = False
    backward_ahead: BackwardAhead | None = None


def aot(
    gm: torch.nn.Module,
    example_inputs: Sequence[object],
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    *,
    decompositions: Mapping | None = None,
    partitioner: str = "min_cut",
    dynamic: bool = False,
    cache: SignatureCache | None = None,
    direct_gradients: bool = False,
    backward_ahead: BackwardAhead | None = None,
) -> AOTCompiled:
    """Compile ``gm`` for ``example_inputs``; the result takes the graph's inputs.

    ``gm``'s parameters, buffers and tensor constants are lifted to graph inputs, read from
    the module at every call: gradients land in their ``.grad`` and in-place updates (BatchNorm
    running statistics) land in the module. A compiler is ``compiler(gm, example_inputs) ->
    callable``; ``bw_compiler=None`` uses ``fw_compiler`` for the backward graph too.
    ``partitioner`` is ``"min_cut"`` (fewest bytes saved for the backward) or ``"default"``
    (save every forward value the backward reads). ``dynamic=True`` traces with symbolic
    sizes; fake example inputs with symbolic sizes, or SymInt example inputs, do so too.

    The graph is compiled now for the example inputs (inference or training, as the grad
    mode and the inputs' ``requires_grad`` say), and again on a call whose inputs differ in
    grad mode, ``requires_grad``, dtype, device, a constant's value or (for static shapes)
    size, stride and int value.

    ``cache`` (an object with ``load(key) -> bytes | None`` and ``store(key, data)``) keeps
    each traced signature's graphs as a record; a later compile of the same signature (in
    this process or another) rebuilds them from it without tracing
    (:mod:`kiln_autograd.signature_cache`). A compiler given such a graph
    (:func:`is_restored`) may raise :class:`NeedsTrace` to have the signature traced.

    ``direct_gradients=True`` has a training graph's backward write its parameters'
    gradients into their ``.grad`` itself, in ``loss.backward()``, instead of through one
    autograd accumulator node per parameter; parameters are then out of reach of
    ``torch.autograd.grad`` and ``backward(inputs=...)`` (:mod:`kiln_autograd.direct_gradients`).

    ``backward_ahead(compile, bw_graph, example_inputs)`` is asked, once a training
    signature is partitioned and before its forward compiles, to start compiling its
    backward graph (where its sizes are numbers): it returns what gives the compiled graph
    at the first backward (waiting for it), or None to have the first backward compile it,
    as it does without the hook.
    """
    if partitioner not in PARTITIONERS:
        raise ValueError(
            f"aot(partitioner={partitioner!r}) is not a partitioner; use one of "
            f"{sorted(PARTITIONERS)}"
        )
    example_inputs = captured_examples(gm, example_inputs)
    options = Options(
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler or fw_compiler,
        decompositions=decompositions,
        partitioner=partitioner,
        dynamic=dynamic or is_dynamic(example_inputs),
        cache=cache,
        direct_gradients=direct_gradients,
        backward_ahead=backward_ahead,
    )
    lifted = lift(gm)
    state = captured_state_inputs(gm, list(example_inputs))
    static = frozenset(range(lifted.num_state)) | {lifted.num_state + i for i in state}
    compiled = AOTCompiled(lifted, list(example_inputs), options, static)
    compiled.compile_for(compiled.flat_args(example_inputs))
    return compiled


class AOTCompiled:
    """The callable :func:`aot` returns: one compiled runner per input signature."""

    def __init__(
        self,
        lifted: LiftedModule,
        example_inputs: list[object],
        options: Options,
        static_inputs: frozenset[int] = frozenset(),
    ) -> None:
        self.lifted = lifted
        self.example_inputs = example_inputs
        self.options = options
        self.static_inputs = static_inputs  # flat inputs that are module state
        self.runners: dict[tuple, InferenceRunner | TrainingRunner] = {}
        self.record_keys: dict[tuple, str] = {}  # the record key of each signature's runner
        self.direct: tuple[list[int], str] | None = None  # parameters, device (direct_gradients)

    def flat_args(self, user_inputs: Sequence[object]) -> list[object]:
        """The lifted state (read from the module now) followed by the user's inputs."""
        return [*self.lifted.state(), *user_inputs]

    def __call__(self, *user_inputs: object) -> object:
        args = self.flat_args(user_inputs)
        runner = self.runners.get(self._key(args)) or self.compile_for(args)
        return runner(*args)

    def guarded(self) -> Callable:
        """The callable for a caller that guards its inputs, as capture does: every call
        matches the example inputs' signature (grad mode, dtypes, devices,
        ``requires_grad``, and sizes and strides unless dynamic), so no key is computed per
        call. It is the runner compiled by :func:`aot`, or the compiled graph itself where
        the runner has nothing to add."""
        if not self.options.dynamic and _symbolic_placeholders(self.lifted.module):
            return self  # the caller's guards let sizes vary that this trace fixed: keyed
        (runner,) = self.runners.values()
        call = runner.entry_point()
        if not self.lifted.num_state:
            return call
        state = self.lifted.state
        return lambda *user_inputs: call(*state(), *user_inputs)

    def restore_token(self) -> str | None:
        """What :func:`restore` rebuilds :meth:`guarded` from in another process, through
        the record cache: None where the graph keeps no record (dynamic sizes, no cache,
        not one signature, module state read from the graph module)."""
        if self.options.dynamic or self.lifted.num_state or len(self.record_keys) != 1:
            return None
        (key,) = self.record_keys.values()
        return json.dumps({"key": key, "direct": self.direct})

    def compile_for(self, args: list[object]) -> InferenceRunner | TrainingRunner:
        """Compile the graph for the signature of ``args`` and remember the runner."""
        trace_args = self._trace_args(args) if self.options.dynamic else args
        requires_grad, grad_enabled = _requires_grad(args), torch.is_grad_enabled()
        key = signature_key(
            self.lifted, trace_args, requires_grad, grad_enabled, self.options, self.static_inputs
        )
        runner = compile_signature(
            self.lifted,
            trace_args,
            requires_grad=requires_grad,
            grad_enabled=grad_enabled,
            options=self.options,
            static_inputs=self.static_inputs,
            key=key,
        )
        if self.options.direct_gradients and isinstance(runner, TrainingRunner):
            positions = eligible_parameters(args, self.static_inputs, runner.meta.mutated_inputs)
            if positions:
                device = args[positions[0]].device
                runner.write_gradients_directly(positions, device)
                self.direct = (list(positions), str(device))
        self.runners[self._key(args)] = runner
        if key is not None:
            self.record_keys[self._key(args)] = key
        return runner

    def _trace_args(self, args: list[object]) -> list[object]:
        """With dynamic shapes: the symbolic example inputs where the call matches them.

        Tensors and ints come from the examples (their sizes are symbols); floats, bools
        and other constants come from the call. A call whose tensors differ from the
        examples in dtype, device or rank is traced from its own inputs, every size a symbol.
        """
        n = self.lifted.num_state
        user = args[n:]
        if len(user) != len(self.example_inputs):
            return args
        merged = []
        for arg, example in zip(user, self.example_inputs, strict=True):
            if isinstance(arg, torch.Tensor) and isinstance(example, torch.Tensor):
                same = (arg.dtype, arg.device.type, arg.dim()) == (
                    example.dtype,
                    example.device.type,
                    example.dim(),
                )
                if not same:
                    return args
                merged.append(example)
            elif _is_int(arg) and _is_int(example):
                merged.append(example)
            elif isinstance(arg, torch.Tensor) or isinstance(example, torch.Tensor):
                return args
            else:
                merged.append(arg)
        return [*args[:n], *merged]

    def _key(self, args: Sequence[object]) -> tuple:
        grad = torch.is_grad_enabled()
        return (grad, *(_arg_key(a, grad, static=not self.options.dynamic) for a in args))


def compile_signature(
    lifted: LiftedModule,
    args: Sequence[object],
    requires_grad: Sequence[bool],
    grad_enabled: bool,
    options: Options,
    static_inputs: frozenset[int] = frozenset(),
    key: str | None = None,
) -> InferenceRunner | TrainingRunner:
    """The pipeline for one input signature, top to bottom. ``static_inputs`` (module
    state) are noted on each graph for the compilers (``kiln_autograd.static_inputs``).
    A signature's record under ``key`` (its
    :func:`~kiln_autograd.signature_cache.signature_key`; None: not cached) is restored
    instead where one is stored, and stored after tracing
    (:mod:`kiln_autograd.signature_cache`)."""
    restored = restore_runner(options, key)
    if restored is not None:
        return restored

    if options.partitioner == "min_cut" and grad_enabled and any(requires_grad):
        import_min_cut_in_background()  # while the graphs are traced
    fake_args, fake_mode = fake_inputs(args, requires_grad, dynamic=options.dynamic)
    with fake_mode:
        meta = analyze(lifted.call_raw, fake_args, grad_enabled=grad_enabled)
    table = decomposition_table(options.decompositions)

    if not (grad_enabled and any(requires_grad) and differentiable_outputs(meta)):
        graph = trace_inference(lifted.call_raw, fake_args, meta, fake_mode, table)
        verify_op_set(graph.gm, "inference graph")
        log.debug("inference graph:\n%s", graph)
        note_static_inputs(graph.gm, set(static_inputs))
        note_unwritten_state(graph.gm, set(static_inputs), meta.mutated_inputs)
        data = encode_record(key, encode_inference, graph.gm, meta)
        compile_fw = store_after(options.fw_compiler, options, key, data)
        return InferenceRunner(compile_fw(graph.gm, example_values(graph.gm)), meta)

    joint = trace_joint(lifted.call_raw, fake_args, meta, fake_mode, table)
    verify_op_set(joint.gm, "joint graph")
    parts = PARTITIONERS[options.partitioner](joint)
    log.debug("%s partition saves %d bytes:\n%s", options.partitioner, parts.saved_bytes(), parts)
    note_static_inputs(parts.fw, set(static_inputs))
    n_fw = parts.num_fw_outputs
    note_saved_outputs(parts.fw, range(n_fw, n_fw + parts.num_saved_tensors))
    primals = [n.name for n in joint.gm.graph.nodes if n.op == "placeholder"]
    note_static_inputs(parts.bw, {primals[i] for i in static_inputs})
    data = encode_record(key, encode_training, parts, joint)
    compile_bw = store_after(options.bw_compiler, options, key, data)
    bw_inputs = example_values(parts.bw)
    started = None
    if options.backward_ahead and not options.dynamic and not is_dynamic(bw_inputs):
        started = options.backward_ahead(compile_bw, parts.bw, bw_inputs)
    compile_bw = started or functools.partial(compile_bw, parts.bw, bw_inputs)
    compiled_fw = options.fw_compiler(parts.fw, example_values(parts.fw))
    return TrainingRunner(compiled_fw, parts, joint, compile_bw)


def restore(
    token: str,
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    *,
    cache: SignatureCache,
) -> Callable | None:
    """What ``aot(...).guarded()`` returned, rebuilt from the record cache in another
    process: ``token`` is that compile's :meth:`AOTCompiled.restore_token`. None where the
    record is not in ``cache`` or a compiler needs the traced graphs (:class:`NeedsTrace`):
    the caller then compiles as before. Its caller guards the inputs, as for ``guarded()``."""
    found = json.loads(token)
    options = Options(fw_compiler, bw_compiler or fw_compiler, None, "min_cut", False, cache)
    runner = restore_runner(options, found["key"])
    if runner is None:
        return None
    if found["direct"] and isinstance(runner, TrainingRunner):
        positions, device = found["direct"]
        runner.write_gradients_directly(positions, torch.device(device))
    return runner.entry_point()


def trace_joint_graph(
    gm: torch.nn.Module,
    example_inputs: Sequence[object],
    *,
    decompositions: Mapping | None = None,
    dynamic: bool = False,
) -> JointGraph:
    """The joint forward/backward graph of ``gm`` (state lifted first), for inspection.

    Inputs that require grad (and ``gm``'s parameters that do) get gradients.
    """
    lifted = lift(gm)
    args = [*lifted.state(), *example_inputs]
    dynamic = dynamic or is_dynamic(example_inputs)
    fake_args, fake_mode = fake_inputs(args, _requires_grad(args), dynamic=dynamic)
    with fake_mode:
        meta = analyze(lifted.call_raw, fake_args, grad_enabled=True)
    table = decomposition_table(decompositions)
    return trace_joint(lifted.call_raw, fake_args, meta, fake_mode, table)


def trace_inference_graph(
    gm: torch.nn.Module,
    example_inputs: Sequence[object],
    *,
    decompositions: Mapping | None = None,
    dynamic: bool = False,
) -> TracedGraph:
    """The functional aten graph of ``gm`` with grad disabled (state lifted first)."""
    lifted = lift(gm)
    args = [*lifted.state(), *example_inputs]
    dynamic = dynamic or is_dynamic(example_inputs)
    fake_args, fake_mode = fake_inputs(args, [False] * len(args), dynamic=dynamic)
    with fake_mode:
        meta = analyze(lifted.call_raw, fake_args, grad_enabled=False)
    table = decomposition_table(decompositions)
    return trace_inference(lifted.call_raw, fake_args, meta, fake_mode, table)


def partition(joint: JointGraph, partitioner: str = "min_cut") -> PartitionedGraphs:
    """Split a joint graph into forward and backward graphs with the named partitioner."""
    if partitioner not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {partitioner!r}; use one of {sorted(PARTITIONERS)}")
    return PARTITIONERS[partitioner](joint)


def _requires_grad(args: Sequence[object]) -> list[bool]:
    return [isinstance(a, torch.Tensor) and a.requires_grad for a in args]


def _symbolic_placeholders(gm: torch.nn.Module) -> bool:
    """Whether ``gm``'s inputs were captured with symbolic sizes (``example_value``)."""
    graph = getattr(gm, "graph", None)
    nodes = graph.find_nodes(op="placeholder") if graph is not None else ()
    return is_dynamic([n.meta.get("example_value", n.meta.get("val")) for n in nodes])


def _is_int(value: object) -> bool:
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def _arg_key(value: object, grad: bool, static: bool) -> tuple:
    if isinstance(value, torch.Tensor):
        rg = grad and value.requires_grad
        if static:
            return (value.dtype, value.device, rg, tuple(value.shape), value.stride())
        return (value.dtype, value.device, rg, value.dim())
    if _is_int(value) and not static:
        return (int,)  # a symbol: any value
    if isinstance(value, (bool, int, float, str, type(None))):
        return (type(value), value)  # baked into the graph as a constant
    return (type(value),)
