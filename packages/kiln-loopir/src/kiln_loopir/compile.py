"""``compile_fx``: the whole pipeline of kiln-loopir, top to bottom, in one function."""

from __future__ import annotations

import contextlib
import logging
import os
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from kiln_loopir import runtime, size_math, symbols
from kiln_loopir.codegen import Codegen, resolve_codegen
from kiln_loopir.collection import collection_paused
from kiln_loopir.constants import fold_constants
from kiln_loopir.dce import eliminate_dead_nodes
from kiln_loopir.decompose import decompose
from kiln_loopir.greedy_fusion import fuse
from kiln_loopir.host import HostNotRendered, generate_host, kernel_launch_args
from kiln_loopir.ir import LoopGraph
from kiln_loopir.kernel import Kernel, Schedule
from kiln_loopir.launch import LaunchGroup, launch_groups
from kiln_loopir.loops import merge_reduction_loops
from kiln_loopir.lowering import lower
from kiln_loopir.memory import MemoryPlan, plan_memory
from kiln_loopir.scheduler import order, unfused_schedule

log = logging.getLogger("kiln.loopir")
HOST_PROGRAMS = ("auto", "python", "native")


@dataclass(eq=False)
class CompiledKernel:
    """One generated kernel: its IR, its source and the callable the codegen built."""

    name: str
    kernel: Kernel
    source: str
    fn: Callable


@dataclass(eq=False)
class CompiledLaunchGroup:
    """Consecutive kernels started by one call: the group, its source and its callable."""

    name: str
    group: LaunchGroup
    source: str
    fn: Callable


class HostProgram:
    """A loaded host program.

    ``call(*inputs) -> tuple`` runs the graph; ``check(*inputs)`` checks the layouts of the
    inputs whose sizes and strides are numbers (``call`` checks the others). Calling the
    program runs both: that is the entry point for callers that do not guard their inputs.
    A caller whose guards already pin every input's size and stride calls ``call``.

    ``call`` is the native host program where the code generator built one (``native``:
    kernels and host program in one library, see ``Codegen.render_host``), else the
    Python one (``python_call``). ``load_python()`` gives the Python program's ``(call,
    check)``: with a native program it runs where something first asks for them (a call
    the native program hands back, or a caller that checks its inputs), since compiling a
    large graph's program costs a tenth of a second that a warm start would spend for
    nothing.
    """

    def __init__(
        self,
        load_python: Callable[[], tuple[Callable[..., tuple], Callable[..., None]]],
        source: str,
        native: Callable[..., tuple] | None = None,
    ):
        self._load_python = load_python
        self._python = None if native is not None else load_python()
        self.native = native
        self.host_source = source

    def _python_program(self) -> tuple[Callable[..., tuple], Callable[..., None]]:
        if self._python is None:
            self._python = self._load_python()
        return self._python

    @property
    def python_call(self) -> Callable[..., tuple]:
        return self._python_program()[0]

    @property
    def check(self) -> Callable[..., None]:
        return self._python_program()[1]

    @property
    def call(self) -> Callable[..., tuple]:
        return self.native if self.native is not None else self.python_call

    @property
    def input_names(self) -> tuple[str, ...]:
        code = self.python_call.__code__
        return code.co_varnames[: code.co_argcount]

    def __call__(self, *inputs: object) -> tuple:
        if len(inputs) != len(self.input_names):
            raise TypeError(
                f"the compiled graph takes {len(self.input_names)} inputs "
                f"({', '.join(self.input_names)}), got {len(inputs)}"
            )
        self.check(*inputs)
        return self.call(*inputs)

    def with_last_inputs(self, values: Sequence[object]) -> Callable[..., tuple]:
        """``call`` with its last inputs bound to ``values`` (the graph's constants): the
        caller passes the others, and nothing per call is added."""
        if not values:
            return self.call
        if self.native is not None:
            bound = self.native.bind_last(tuple(values))
            bound.host_source = self.host_source
            return bound
        call = self.python_call
        bound = types.FunctionType(call.__code__, call.__globals__, call.__name__, tuple(values))
        bound.host_source = self.host_source  # what the CUDA-graph runtime inspects
        return bound


def load_host_program(
    host_source: str,
    kernels: Mapping[str, Callable],
    constants: Mapping[str, object],
    filename: str = "<kiln-loopir host program>",
    native: Callable[..., tuple] | None = None,
) -> HostProgram:
    """The functions of a host program's source, bound to its kernels (name -> callable),
    its constants (name -> value) and the runtime helpers. With a ``native`` program, the
    Python one is compiled where it is first needed (:class:`HostProgram`)."""
    namespace: dict[str, object] = {
        "torch": torch,
        "aten": torch.ops.aten,
        "as_strided": torch.as_strided,
        "empty_strided": runtime.empty_strided,
        "reinterpret": runtime.reinterpret,
        "assert_size_stride": runtime.assert_size_stride,
        "match_layout": runtime.match_layout,
        "view_layout": runtime.view_layout,
        "bind_op": runtime.bind_op,
        # sizes such as Max(s0, 1) print as maximum(s0, 1), CeilToInt(x) as ceil_to_int(x)
        **size_math.FUNCTIONS,
    }
    namespace.update(kernels)
    namespace.update(constants)

    def own_kernel(name: str, op: torch._ops.OpOverload) -> Callable:
        """The code generator's kernel ``name`` computing an extern step (its Python form,
        taking and returning what ``op`` does), where ``kernels`` has it; else ``op``."""
        return namespace[name] if name in namespace else runtime.bind_op(op)

    namespace["own_kernel"] = own_kernel

    def load_python() -> tuple[Callable[..., tuple], Callable[..., None]]:
        exec(compile(host_source, filename, "exec"), namespace)
        call = namespace["call"]
        call.host_source = host_source  # what the CUDA-graph runtime inspects
        return call, namespace["check"]  # type: ignore[return-value]

    program = HostProgram(load_python, host_source, native)
    if native is not None:
        learn = getattr(native, "learn_sizes", None)
        native.set_fallback(python_fallback(lambda: program.python_call, learn))
    if native is not None and constants:
        program.native = native = native.bind_last(tuple(constants.values()))
    if native is not None:
        native.host_source = host_source
    return program


def python_fallback(
    python_call: Callable[[], Callable[..., tuple]], learn: Callable | None
) -> Callable[..., tuple]:
    """What runs a call the native program hands back: the Python program
    (``python_call()`` gives it, compiled at the first such call; given the inputs it
    takes); then ``learn(inputs)`` where the native program learns sizes from the Python
    one's launches (``inputs``: all of them, constants last)."""

    def run(*inputs: object) -> tuple:
        call = python_call()
        outputs = call(*inputs[: call.__code__.co_argcount])
        if learn is not None:
            learn(inputs)
        return outputs

    return run


class CompiledGraph:
    """A graph compiled to kernels and a host program.

    Call it with the graph's inputs; it returns the outputs as a flat tuple. ``kernels``
    holds the generated kernels (each with its ``source``), ``launch_groups`` the runs of
    kernels the host program starts with one call (where the code generator chains
    kernels), ``host_source`` the host program, ``program`` the loaded
    :class:`HostProgram`, and
    ``graph``/``schedule``/``memory_plan`` the stages that made them.
    """

    def __init__(
        self,
        graph: LoopGraph,
        schedule: Schedule,
        memory_plan: MemoryPlan,
        kernels: list[CompiledKernel],
        host_source: str,
        codegen: Codegen,
        launch_groups: Sequence[CompiledLaunchGroup] = (),
        native_host: object = None,
    ) -> None:
        self.graph = graph
        self.schedule = schedule
        self.memory_plan = memory_plan
        self.kernels = kernels
        self.host_source = host_source
        self.codegen = codegen
        self.launch_groups = list(launch_groups)
        self.native_host = native_host  # the codegen's rendering of it, or None
        own = getattr(native_host, "python_externs", {})
        self.program = load_host_program(
            host_source,
            {k.name: k.fn for k in [*kernels, *self.launch_groups]} | dict(own.values()),
            {c.name: c.value for c in graph.constants},
            native=getattr(native_host, "program", None),
        )

    def __call__(self, *inputs: object) -> tuple:
        return self.program(*inputs)

    def __repr__(self) -> str:
        return (
            f"CompiledGraph({len(self.kernels)} kernels, "
            f"{len(self.schedule.steps) - len(self.kernels)} extern calls, "
            f"codegen={getattr(self.codegen, 'name', type(self.codegen).__name__)})"
        )


def graph_device(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> torch.device:
    """The device of the graph's tensors (its inputs first, then any node's value)."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def schedule_graph(graph: LoopGraph, *, fusion: bool = True) -> Schedule:
    """Kernels from the IR: one per node, then fused, then ordered for low live memory."""
    schedule = unfused_schedule(graph)
    if fusion:
        schedule = fuse(schedule)
    return order(schedule)


@collection_paused()
def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    *,
    codegen: Codegen | str | None = None,
    fusion: bool = True,
    reuse_memory: bool = True,
    host_program: str | None = None,
    stage: Callable[[str], contextlib.AbstractContextManager] | None = None,
) -> CompiledGraph:
    """Compile a functional aten graph (fake-tensor ``meta["val"]`` on its nodes).

    ``codegen`` is a codegen object, the name of one (``"reference"`` is built in), or None
    to take the installed one (``kiln.codegen`` entry points) that serves the inputs' device.
    ``host_program``: ``"auto"`` (default, or ``$KILN_HOST_PROGRAM``) runs the native host
    program where the codegen builds one and the Python one elsewhere, ``"python"`` always
    the Python one, ``"native"`` raises where no native one can be built.
    ``stage(name)``, a context manager, times the stages for the caller: ``lowering``
    (1-3), ``fusion`` (4), ``memory`` (5-6); rendering and building are the codegen's.
    """
    stage = stage or (lambda name: contextlib.nullcontext())
    device = graph_device(gm, example_inputs)
    backend = resolve_codegen(codegen, device.type)
    if hasattr(backend, "begin_compile"):
        backend.begin_compile()  # what building the kernels needs, begun as lowering starts
    with stage("lowering"):
        with symbols.keeps_sizes_symbolic(example_inputs):  # symbolic sizes stay symbols
            gm = decompose(gm)  # 1. the norms through torch._decomp
            graph = lower(
                gm,
                example_inputs,
                scans=getattr(backend, "renders_scans", False),
                masked_strided_reads=getattr(backend, "vectorises_masked_strided_reads", True),
            )
        graph.verify()  # 2. the loop IR
        fold_constants(graph)  # 3. one-element constants written into the nodes reading them,
        eliminate_dead_nodes(graph)  # then what nothing reads dropped
        graph.verify()
    with stage("fusion"):
        schedule = schedule_graph(graph, fusion=fusion)  # 4. kernels, fusion, order
        if getattr(backend, "merges_reduction_loops", False):  # runs as one loop where it can
            for kernel in schedule.kernels():
                merge_reduction_loops(kernel)
        schedule.verify()
    with stage("memory"):
        plan = plan_memory(schedule, reuse=reuse_memory)  # 5. allocation, reuse, in place
        kernel_launch_args(schedule)  # 6. what each kernel is passed
    # 8. (prepared) the host program, natively: rendered before the kernels are built and
    # built with them (render_host), or built after them where they plan it (build_host)
    render = getattr(backend, "render_host", None)
    build = getattr(backend, "build_host", None) if render is None else None
    prepare = getattr(backend, "prepare_host", None) if build is not None else None
    if prepare is not None and host_choice(host_program) != "python":
        prepare(schedule)  # what it needs, begun before the kernels render
    groups = launch_groups(schedule) if hasattr(backend, "render_group") else []
    sources = [backend.render(k) for k in schedule.kernels()]  # 7. kernels, launch groups
    group_sources = [backend.render_group(g) for g in groups]
    native = None
    if build is None:
        make = (lambda: render(schedule, plan)) if render is not None else None
        native = native_host(backend, make, host_program)
    if native is None:
        fns = backend.compile(sources + group_sources)
    else:
        fns = backend.compile(sources + group_sources, host=native)
        native.program = fns.pop()
    if build is not None:
        by_name = dict(zip((k.name for k in schedule.kernels()), fns, strict=False))
        native = native_host(backend, lambda: build(schedule, plan, by_name), host_program)
    kernels = [
        CompiledKernel(k.name, k, src, fn)
        for k, src, fn in zip(schedule.kernels(), sources, fns[: len(sources)], strict=True)
    ]
    launchers = [
        CompiledLaunchGroup(g.name, g, src, fn)
        for g, src, fn in zip(groups, group_sources, fns[len(sources) :], strict=True)
    ]
    host_source = generate_host(schedule, plan, groups, own_extern_names(native))
    return CompiledGraph(graph, schedule, plan, kernels, host_source, backend, launchers, native)


def own_extern_names(native: object) -> dict[int, str]:
    """The extern steps a native host program computes with kernels of the code generator's
    own, which its Python program calls too (``python_externs``: step index -> (name,
    callable)), by name: the first calls, run by the Python program while the native one
    builds, then run what every later call runs."""
    return {i: name for i, (name, _) in getattr(native, "python_externs", {}).items()}


def host_choice(choice: str | None) -> str:
    """The host program asked for: ``choice``, else ``$KILN_HOST_PROGRAM``, else auto."""
    choice = choice or os.environ.get("KILN_HOST_PROGRAM", "auto")
    if choice not in HOST_PROGRAMS:
        raise ValueError(f"host_program={choice!r}: use one of {HOST_PROGRAMS}")
    return choice


def native_host(backend: Codegen, make: Callable | None, choice: str | None):
    """The codegen's native host program (``make()``: its ``render_host`` before the kernels
    are built, or ``build_host`` after), or None where the Python one runs: by choice, or
    because the codegen has none (``make`` is None) or it does not cover the graph
    (logged)."""
    choice = host_choice(choice)
    if choice == "python":
        return None
    if make is None:
        reason = f"{getattr(backend, 'name', backend)} makes no native host program"
    else:
        try:
            native = make()
            log.info("host program: native (%s)", getattr(backend, "name", backend))
            return native
        except HostNotRendered as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - any other failure: the Python program runs
            reason = f"{type(exc).__name__}: {exc}"
            if choice == "auto":
                log.warning("host program: Python, the native one failed (%s)", reason)
                return None
    if choice == "native":
        raise NotImplementedError(f"no native host program: {reason}")
    log.info("host program: Python (%s)", reason)
    return None
