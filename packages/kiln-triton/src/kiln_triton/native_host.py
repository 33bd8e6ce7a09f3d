"""The native host program on CUDA: kiln-cpp's C++ host program (see
:mod:`kiln_cpp.host`) with each kernel launched through the CUDA driver.

When a graph's sizes are all numbers, every kernel is planned when the graph compiles: its
launch configuration is picked (timed, for big kernels) on zero-filled tensors of its
arguments' layouts, and the compiled kernel is loaded. What a launch needs is then known
and written into the source: the grid, the block, the shared memory and each parameter
(pointers, sizes, the null scratch pointers newer Triton appends). The kernel handles are
handed to the program when it loads. A call whose input tensors are not 16-byte aligned
(as the kernels were compiled to assume) is handed to the Python host program. A graph
whose sizes are symbols plans each call's launches from the families of sizes it learned
instead (:mod:`kiln_triton.sized_launches`).

It is kiln-cpp's host program and runtime (kiln-triton depends on kiln-cpp for them).

A split reduction is two launches with a float32 workspace that the program keeps (its
address is handed over with the kernel handles). Kernels this does not cover (scratch
memory, cluster launches, an interpreter or launch hooks) raise ``HostNotRendered``: the
Python host program runs the graph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sympy
import torch

from kiln_loopir.host import HostNotRendered
from kiln_loopir.ir import ExternNode, TensorRef
from kiln_loopir.kernel import Kernel, Schedule
from kiln_loopir.memory import MemoryPlan
from kiln_loopir.scheduler import schedule_reads
from kiln_triton import host_builds
from kiln_triton.attention import AttentionCall, attention_call
from kiln_triton.attention_backward import BackwardCall, attention_backward_call
from kiln_triton.attention_kernels import KERNELS, compile_ahead, compile_attention
from kiln_triton.compile_pool import compiles_for_gpu
from kiln_triton.compiled_launch import ptx_params, unlaunchable
from kiln_triton.device import INTERPRET
from kiln_triton.launcher import TritonKernel
from kiln_triton.python_externs import KernelLaunch
from kiln_triton.sized_launches import FamilyTable, SizedLauncher, alignment_checks, is_sized

log = logging.getLogger("kiln.triton")

C_TYPES = {"i32": "int32_t", "i64": "int64_t", "u32": "uint32_t", "u64": "uint64_t"}
C_TYPES |= {"fp32": "float", "fp64": "double"}


@dataclass(frozen=True)
class Workspace:
    """A split reduction's workspace: its address is the program's ``index``-th handle."""

    index: int


@dataclass
class PlannedLaunch:
    """One kernel's launch, as the source writes it."""

    function: int  # index into the program's kernel handles
    grid: tuple[int, int, int]
    block: int
    shared: int
    params: list[tuple[str, object]]  # (C type, buffer name or value); "void*" for pointers


def build_host(schedule: Schedule, plan: MemoryPlan, kernels: dict[str, TritonKernel]):
    """The loaded native host program of ``schedule`` (raises ``HostNotRendered``): its
    launches planned now where its sizes are numbers, else per call from the families of
    sizes it learned (see :mod:`kiln_triton.sized_launches`)."""
    from kiln_cpp.host import load_runtime, render_host

    _require_compiled_kernels()
    if is_sized(schedule):
        host = render_host(schedule, plan, load_runtime(), SizedLauncher(schedule, kernels))
        return _with_size_table(_loaded(host, wait=True), kernels)
    launcher = CudaLauncher(schedule, kernels)
    host = render_host(schedule, plan, load_runtime(), launcher)
    host.workspaces = launcher.workspaces  # their addresses are in the program
    host.python_externs = launcher.python_externs(schedule)  # the Python program's too
    return _loaded(host)


def compile_attention_ahead(schedule: Schedule) -> int:
    """Hand the compiles of the attention kernels of Kiln's that the native host program
    of ``schedule`` will launch to the compile workers, to build beside its kernels (the
    program's planning then finds them built); returns how many were handed over."""
    if not compiles_for_gpu() or is_sized(schedule):
        return 0
    read = schedule_reads(schedule)
    records = []
    for step in schedule.steps:
        if isinstance(step, ExternNode):
            call = attention_call(step, read) or attention_backward_call(step, read)
            if call is not None:
                records.append(call.compile_args(str(call.q.device)))
    return compile_ahead(records)


def _with_size_table(host, kernels: dict[str, TritonKernel]):
    """``host`` whose program learns the launches of a new size's families after the
    Python program ran it."""
    record = host.launches[0]["sized"]
    host.program.learn_sizes = FamilyTable(record, kernels, host.program.library)
    return host


def rebuild_host(data: dict, kernels: dict[str, TritonKernel]):
    """A native host program from a cache entry (``NativeHost.to_dict``): each kernel
    planned again (its launch configuration comes from the autotuning cache), which must
    give the launch the source was written for, else ``HostNotRendered``."""
    from kiln_cpp.host import NativeHost, load_runtime

    _require_compiled_kernels()
    host = NativeHost.from_dict(data, load_runtime())
    if host.launches and "sized" in host.launches[0]:
        return _with_size_table(_loaded(host, wait=True), kernels)
    workspaces: list[torch.Tensor] = []  # split reductions': kept while the program lives
    for record in host.launches:
        if "attention" in record:
            compiled, _ = compile_attention(**record["attention"])
            if _shape_of_compiled(record["attention"]["grid"], compiled) != record["launch"]:
                raise HostNotRendered("the attention kernel plans another launch than cached")
            host.functions.append(int(compiled.function))
            continue
        scratch = [_zeros(*a) for a in record["args"]]
        launch = _planned(kernels[record["kernel"]], scratch)
        if record.get("split"):
            if launch is None or launch.split is None:
                raise HostNotRendered(f"{record['kernel']} is no longer a split reduction")
            first, finish = _compile_split(launch, scratch)
            shapes = [
                _shape_of_compiled(launch.grid, first),
                _shape_of_compiled(launch.split.grid, finish),
            ]
            if shapes != record["launch"]:
                raise HostNotRendered(f"{record['kernel']} plans other launches than cached")
            host.functions += [int(first.function), int(finish.function)]
            host.functions.append(launch.split.workspace.data_ptr())
            workspaces.append(launch.split.workspace)
            continue
        compiled = getattr(launch, "compiled", None)
        if compiled is None or _shape_of(launch, compiled) != record["launch"]:
            raise HostNotRendered(f"{record['kernel']} plans another launch than the cached one")
        host.functions.append(int(compiled.function))
    host.workspaces = workspaces  # their addresses are in the program
    return _loaded(host)


def _loaded(host, wait: bool = False):
    """``host`` with its ``program``: built (kiln-cpp's library cache) and loaded, or
    running the Python program until its library, built in the background, is loaded
    (:mod:`kiln_triton.host_builds`; ``wait``: built now)."""
    return host_builds.load(host, wait)


def _require_compiled_kernels() -> None:
    if INTERPRET:
        raise HostNotRendered("Triton's interpreter runs the kernels (TRITON_INTERPRET=1)")


def _planned(fn: TritonKernel, scratch: list[torch.Tensor]):
    """``fn``'s launch at the static sizes of ``scratch``: planned (and timed, for a big
    kernel) by one call on it, which also compiles and loads the kernel."""
    fn(*scratch)
    return fn._launches.get(())


def _compile_split(launch, scratch: list[torch.Tensor]):
    """The two compiled kernels of a split reduction's launches, loaded (compiled ahead
    by the compile workers where they could, else through Triton's launcher here)."""
    s = launch.split
    if s.compiled:
        return s.compiled
    first = _compiled(
        launch.fn, [*scratch, *launch.numels, s.workspace, s.rsplit], launch.grid, launch.kwargs
    )
    finish = _compiled(
        s.finish, [*scratch, *launch.numels, s.workspace, s.nsplit, s.rsplit], s.grid, s.kwargs
    )
    return first, finish


def _compiled(fn, args: list, grid: tuple, kwargs: dict):
    kernel = fn.run(*args, grid=grid, warmup=True, **kwargs)
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    kernel[grid]  # loads the module: its function handle exists from here on
    return kernel


def _zeros(size, stride, dtype: str, device: str) -> torch.Tensor:
    dtype = getattr(torch, dtype)
    return torch.empty_strided(size, stride, dtype=dtype, device=device).zero_()


def _shape_of(launch, compiled) -> list:
    """What the source bakes in of a launch: grid, block, shared memory."""
    return _shape_of_compiled(launch.grid, compiled)


def _shape_of_compiled(grid, compiled) -> list:
    grid = list((*grid, 1, 1)[:3])
    return [grid, 32 * compiled.metadata.num_warps, compiled.metadata.shared]


class CudaLauncher:
    """What :func:`kiln_cpp.host.render_host` asks of a kernel launcher."""

    def __init__(self, schedule: Schedule, kernels: dict[str, TritonKernel]) -> None:
        _require_compiled_kernels()
        self.buffers = schedule.graph.buffers()
        for b in self.buffers.values():
            if any(sympy.sympify(e).free_symbols for e in (*b.size, *b.stride)):
                raise HostNotRendered(f"{b.name} has symbolic sizes: launches are planned once")
        self.functions: list[int] = []
        self.records: list[dict] = []  # per handle: the kernel, its arguments' layouts, launch
        self.launches: dict[str, list[PlannedLaunch]] = {}
        self.pointer_args: set[str] = set()
        self.workspaces: list[torch.Tensor] = []  # split reductions': kept while it lives
        for kernel in schedule.kernels():
            self.launches[kernel.name] = self._plan(kernel, kernels[kernel.name])
        self.device = next(iter(self.buffers.values())).device if self.buffers else "cuda"
        self.attention: dict[int, tuple[AttentionCall | BackwardCall, PlannedLaunch]] = {}

    def _plan(self, kernel: Kernel, fn: TritonKernel) -> list[PlannedLaunch]:
        """The launches of ``kernel`` (none where there is nothing to compute, two for a
        split reduction)."""
        if kernel.size_args:
            raise HostNotRendered(f"{kernel.name} takes sizes {kernel.size_args}")
        scratch = [self._zeros(name) for name in kernel.args]
        launch = _planned(fn, scratch)
        if launch is None:
            return []  # nothing to compute at these sizes
        layouts = [self._layout(name) for name in kernel.args]
        if launch.split is not None:
            return self._plan_split(kernel, launch, scratch, layouts)
        compiled = getattr(launch, "compiled", None)
        if launch.runner is None or compiled is None:
            raise HostNotRendered(f"{kernel.name} has no direct launch (interpreter or hooks)")
        planned = self._launch(
            kernel.name, compiled, launch.grid, launch.fn.arg_names,
            [*kernel.args, *launch.numels], launch.kwargs,
        )  # fmt: skip
        self.records.append(
            {"kernel": kernel.name, "args": layouts, "launch": _shape_of(launch, compiled)}
        )
        return [planned]

    def _plan_split(self, kernel: Kernel, launch, scratch, layouts) -> list[PlannedLaunch]:
        """A split reduction's two launches, their workspace kept by this program (its
        address handed over with the kernel handles)."""
        s = launch.split
        first, finish = _compile_split(launch, scratch)
        workspace = Workspace(len(self.functions) + 2)  # after the two kernels' handles
        planned = [
            self._launch(
                kernel.name, first, launch.grid, launch.fn.arg_names,
                [*kernel.args, *launch.numels, workspace, s.rsplit], launch.kwargs,
            ),
            self._launch(
                f"{kernel.name} (finish)", finish, s.grid, s.finish.arg_names,
                [*kernel.args, *launch.numels, workspace, s.nsplit, s.rsplit], s.kwargs,
            ),
        ]  # fmt: skip
        self.functions.append(s.workspace.data_ptr())
        self.workspaces.append(s.workspace)
        shapes = [_shape_of_compiled(launch.grid, first), _shape_of_compiled(s.grid, finish)]
        self.records.append({"kernel": kernel.name, "args": layouts, "launch": shapes, "split": 1})
        return planned

    def _launch(self, what: str, compiled, grid, names, positional, kwargs) -> PlannedLaunch:
        """One launch of ``compiled``: its parameters from ``positional`` (in the kernel's
        order) and ``kwargs``; its handle appended to the program's."""
        meta = compiled.metadata
        reason = unlaunchable(meta)
        if reason is not None:
            raise HostNotRendered(f"{what}: {reason}")
        names = list(names)
        values = dict(zip(names, positional, strict=False))
        values.update({n: kwargs[n] for n in names if n in kwargs})
        params = _params(what, names, values, compiled)
        self.pointer_args |= {v for ctype, v in params if ctype == "void*" and isinstance(v, str)}
        self.functions.append(int(compiled.function))
        grid = (*grid, 1, 1)[:3]
        return PlannedLaunch(
            len(self.functions) - 1, grid, 32 * meta.num_warps, meta.shared, params
        )

    def _layout(self, name: str) -> tuple:
        b = self.buffers[name]
        size = tuple(int(s) for s in b.size)
        stride = tuple(int(s) for s in b.stride)
        return (size, stride, str(b.dtype).removeprefix("torch."), str(b.device))

    def _zeros(self, name: str) -> torch.Tensor:
        return _zeros(*self._layout(name))

    # -- what render_host asks for --------------------------------------------------------
    def prologue(self, inputs: list[str]) -> list[str]:
        lines = ["void* kiln_stream = kiln_api->cuda_stream();"]
        return lines + alignment_checks(inputs, self.pointer_args)

    def lines(self, kernel: Kernel, pointer) -> list[str]:
        """The launch of ``kernel``; ``pointer(name)`` is a buffer's data pointer as C++."""
        planned = self.launches[kernel.name]
        if not planned:
            return [f"// {kernel.name}: nothing to compute at these sizes"]

        def operand(value) -> str:  # a buffer, or a split reduction's workspace
            if isinstance(value, Workspace):
                return f"kiln_functions[{value.index}]"
            return pointer(value)

        names = [kernel.name, f"{kernel.name} (finish)"]
        return [
            line
            for one, name in zip(planned, names, strict=False)
            for line in _launch_lines(one, operand, name)
        ]

    def computes(self, node: ExternNode, read: set[str]) -> str | None:
        """The name of the kernel of Kiln's that computes ``node`` in place of the ATen op
        (:mod:`kiln_triton.attention`, :mod:`kiln_triton.attention_backward`), else None."""
        if id(node) not in self.attention:
            call = attention_call(node, read) or attention_backward_call(node, read)
            if call is None:
                return None
            self.attention[id(node)] = (call, self._plan_attention(call))
            self.pointer_args |= {r.buffer for r in call.operands}  # checked at entry
        return self.attention[id(node)][0].kernel

    def _plan_attention(self, call: AttentionCall | BackwardCall) -> PlannedLaunch:
        compile_args = call.compile_args(str(self.device))
        compiled, grid = compile_attention(**compile_args)
        values = {**compile_args["args"], **call.pointers()}
        names = KERNELS[call.kernel][0].arg_names
        planned = self._launch(call.kernel, compiled, grid, names, [], values)
        self.records.append(
            {"kernel": call.kernel, "attention": compile_args,
             "launch": _shape_of_compiled(grid, compiled)}
        )  # fmt: skip
        return planned

    def python_externs(self, schedule: Schedule) -> dict[int, tuple[str, KernelLaunch]]:
        """The extern steps this program computes with Kiln's kernels, each as the Python
        host program calls it (:mod:`kiln_triton.python_externs`): step index -> (name,
        launch)."""
        own: dict[int, tuple[str, KernelLaunch]] = {}
        for i, step in enumerate(schedule.steps):
            if id(step) not in self.attention:
                continue
            call, planned = self.attention[id(step)]
            function = self.functions[planned.function]
            try:
                launch = KernelLaunch(step, function, planned.grid, planned.block,
                                      planned.shared, planned.params)  # fmt: skip
            except (ValueError, KeyError, TypeError) as exc:  # the Python program calls the op
                log.debug("%s: the Python host program calls the op (%s)", call.kernel, exc)
                continue
            own[i] = (f"{call.kernel}_{i}", launch)
        return own

    def extern_lines(self, node: ExternNode, pointer, ref_pointer) -> list[str] | None:
        """The launch computing ``node`` (after :meth:`computes` took it), else None."""
        if id(node) not in self.attention:
            return None
        call, planned = self.attention[id(node)]

        def operand(value) -> str:
            return ref_pointer(value) if isinstance(value, TensorRef) else pointer(value)

        return _launch_lines(planned, operand, f"{call.kernel} ({node.target})")


def _params(kernel: str, names: list[str], values: dict, compiled) -> list[tuple[str, object]]:
    """The launch parameters of ``compiled`` (its signature less the constants), each as
    (C type, value), the value of a pointer being what ``values`` gives for it; then the
    null scratch pointers its PTX takes after them."""
    params: list[tuple[str, object]] = []
    for key, kind in dict(compiled.src.signature).items():
        name = names[key] if isinstance(key, int) else key
        if kind == "constexpr":
            continue
        if kind.startswith("*"):
            params.append(("void*", values[name]))
        elif kind in C_TYPES:
            params.append((C_TYPES[kind], values[name]))
        else:
            raise HostNotRendered(f"{kernel}: parameter {name} of type {kind}")
    counted = ptx_params(compiled)
    if counted is None:
        raise HostNotRendered(f"{kernel}: no entry point in PTX to count its parameters in")
    extra = counted - len(params)
    if extra < 0:
        raise HostNotRendered(f"{kernel}: its PTX takes fewer parameters than expected")
    return params + [("void*", None)] * extra  # scratch pointers, unused at size 0


def _launch_lines(planned: PlannedLaunch, pointer, what: str) -> list[str]:
    lines = ["{"]
    for i, (ctype, value) in enumerate(planned.params):
        if ctype == "void*":
            init = "nullptr" if value is None else pointer(value)
        else:
            init = repr(float(value)) if ctype in ("float", "double") else str(int(value))
        lines.append(f"  {ctype} p{i} = {init};")
    refs = ", ".join(f"&p{i}" for i in range(len(planned.params))) or "nullptr"
    gx, gy, gz = planned.grid
    return lines + [
        f"  void* params[] = {{{refs}}};",
        f"  if (kiln_api->cuda_launch(kiln_stream, kiln_functions[{planned.function}], "
        f"{gx}, {gy}, {gz}, {planned.block}, {planned.shared}, params))",
        "    return -1;",
        f"}}  // {what}",
    ]
