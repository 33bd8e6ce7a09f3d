"""The host program as C++: the same steps as kiln-loopir's Python host program
(allocations, reuse, kernel calls, extern ops, frees, the outputs), in the graph's shared
library beside its kernels, which it calls directly.

It covers graphs whose sizes are numbers or symbols bound from the inputs' sizes and
strides (the program binds them, checks those inputs' layouts and hands a call whose
inputs do not match to the Python program, which says what is wrong), and whose extern ops
take arguments the runtime can pass (tensors, numbers and sizes, lists of them, dtypes,
devices; see :mod:`kiln_cpp.host.externs`). :func:`render_host` raises
:class:`HostNotRendered` for any other graph (sizes read from tensor data, numbers as
inputs), and the Python host program runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from kiln_cpp.handler import pointer_type
from kiln_cpp.host import gemm
from kiln_cpp.host.arena import Arena, plan_arena
from kiln_cpp.host.externs import ExternCall, HostNotRendered, extern_call, out_variant
from kiln_cpp.printer import cexpr
from kiln_loopir.host import size_sources
from kiln_loopir.ir import Buffer, ExternNode, TensorRef
from kiln_loopir.kernel import Kernel, Schedule
from kiln_loopir.memory import MemoryPlan
from kiln_loopir.scheduler import schedule_reads

PRELUDE = """\
#include <array>

namespace {
const KilnApi* kiln_api;
KilnExtern* kiln_externs[KILN_EXTERNS + 1];
void* kiln_functions[KILN_FUNCTIONS + 1];

// a tensor the program holds: released when reset or when the call returns
struct KilnRef {
  KilnTensor* t = nullptr;
  bool owned = true;
  KilnRef() = default;
  KilnRef(const KilnRef&) = delete;
  ~KilnRef() { reset(); }
  void reset(KilnTensor* n = nullptr) {
    if (t != nullptr && owned) kiln_api->release(t);
    t = n;
    owned = true;
  }
  void borrow(KilnTensor* n) { reset(); t = n; owned = false; }
  KilnTensor* get() const { return t; }
};

inline bool kiln_set(KilnRef& r, KilnTensor* t) { r.reset(t); return t != nullptr; }
}  // namespace

extern "C" int kiln_host_init(const KilnApi* api, KilnExtern* const* externs,
                              void* const* functions) {
  if (api->version != KILN_API_VERSION) return 1;
  kiln_api = api;
  for (int i = 0; i < KILN_EXTERNS; ++i) kiln_externs[i] = externs[i];
  for (int i = 0; i < KILN_FUNCTIONS; ++i) kiln_functions[i] = functions[i];
  return 0;
}
"""


@dataclass
class NativeHost:
    """A rendered C++ host program: its source (without the kernels) and what loading it
    needs: the extern calls to prepare, in order, and how many inputs and outputs."""

    source: str
    externs: list[ExternCall | gemm.GemmCall]  # prepared ATen calls and matrix products
    n_inputs: int  # the graph's inputs, then its constants
    n_outputs: int
    input_names: list[str]
    functions: list[int] = field(default_factory=list)  # kernel handles, in this process
    launches: list[dict] = field(default_factory=list)  # how a launcher planned them (data)
    workspaces: list = field(default_factory=list)  # memory the program has the address of
    program: object = None  # the loaded program, once built

    def to_dict(self) -> dict:
        """Plain data (for an on-disk cache); :meth:`from_dict` makes it again."""
        return {
            "source": self.source,
            "externs": [call.to_dict() for call in self.externs],
            "n_inputs": self.n_inputs,
            "n_outputs": self.n_outputs,
            "input_names": list(self.input_names),
            "launches": list(self.launches),
        }

    @classmethod
    def from_dict(cls, data: dict, runtime) -> NativeHost:
        externs = [
            gemm.rebuild(fields) if fields.get("kind") == "gemm" else ExternCall(**fields)
            for fields in data["externs"]
        ]
        for call in externs:
            call.prepare(runtime)
        return cls(
            data["source"],
            externs,
            data["n_inputs"],
            data["n_outputs"],
            data["input_names"],
            launches=list(data.get("launches", [])),
        )


@dataclass
class _Layouts:
    """Sizes and strides: as static arrays, each written once, where they are numbers; as a
    temporary ``std::array`` of the size expressions where they are not."""

    arrays: dict[tuple[int, ...], str] = field(default_factory=dict)

    def __call__(self, values) -> str:
        exprs = [sympy.sympify(v) for v in values]
        if not exprs:
            return "nullptr"
        if any(not e.is_Integer for e in exprs):
            items = ", ".join(cexpr(e) for e in exprs)
            return f"std::array<int64_t, {len(exprs)}>{{{items}}}.data()"
        key = tuple(int(e) for e in exprs)
        if key not in self.arrays:
            self.arrays[key] = f"kiln_layout{len(self.arrays)}"
        return self.arrays[key]

    def lines(self) -> list[str]:
        return [
            f"const int64_t {name}[] = {{{', '.join(map(str, key))}}};"
            for key, name in self.arrays.items()
        ]


def size_bindings(graph) -> tuple[list[str], list[str]]:
    """C++ that binds each size symbol from the inputs' sizes and strides, and the checks of
    those inputs' layouts (a mismatch hands the call to the Python host program)."""
    sources = size_sources(graph)  # every input is a tensor here
    bind = [
        f"const int64_t {sym} = kiln_api->{attr}({name}.get(), {d});"
        for sym, name, attr, d in sources
    ]
    bound = {sym for sym, *_ in sources}
    check: list[str] = []
    for inp in graph.inputs:
        b = inp.buffer
        if any(not sympy.sympify(e).is_Integer for e in (*b.size, *b.stride)):
            for d, (n, st) in enumerate(zip(b.size, b.stride, strict=True)):
                size = f"kiln_api->size({inp.name}.get(), {d})"
                stride = f"kiln_api->stride({inp.name}.get(), {d})"
                check.append(
                    f"if ({size} != {cexpr(n)} || ({size} > 1 && {stride} != {cexpr(st)}))"
                    " return KILN_RUN_PYTHON;"
                )
    used: set[sympy.Symbol] = set()
    for buf in graph.buffers().values():
        for e in (*buf.size, *buf.stride):
            used |= sympy.sympify(e).free_symbols
    missing = sorted(str(s) for s in used - bound)
    if missing:
        raise HostNotRendered(f"sizes {missing} are not an input's size or stride")
    return bind, check


def render_host(schedule: Schedule, plan: MemoryPlan, runtime, launcher=None) -> NativeHost:
    """The C++ host program of ``schedule`` (raises :class:`HostNotRendered`).

    Kernels are C++ functions of the same library, called directly; or, with ``launcher``,
    whatever ``launcher.lines(kernel)`` writes (kiln-triton: a CUDA launch), after the
    lines of ``launcher.prologue(inputs)`` and below the file-scope lines of
    ``launcher.declarations()`` where it has them, with ``launcher.functions`` (kernel
    handles) passed to the program when it loads."""
    graph = schedule.graph
    for inp in graph.inputs:
        if inp.buffer is None:
            raise HostNotRendered(f"input {inp.name} is a number, not a tensor")
    if any(isinstance(n, ExternNode) and n.binds for n in graph.nodes):
        raise HostNotRendered("sizes are read from tensor data (.item())")
    for out in graph.outputs:
        if not isinstance(out, TensorRef):
            raise HostNotRendered(f"an output is {out!r}, not a tensor")
    read = schedule_reads(schedule)  # every output is a tensor (checked above)
    computes = getattr(launcher, "computes", None)  # extern ops a launcher's kernel computes
    out_filled: dict[int, list[str]] = {}  # the buffers each extern step writes into
    for i, step in enumerate(schedule.steps):
        if computes and isinstance(step, ExternNode) and computes(step, read):
            out_filled[i] = [b.name for b in step.outputs if b is not None]  # unread but one
        elif fills_out(step):
            out_filled[i] = [fills_out(step)]
    kept = {o.buffer for o in graph.outputs}
    arena = plan_arena(schedule, plan, kept, out_filled)
    renderer = _Renderer(graph.buffers(), _Layouts(), runtime, read, launcher, arena)
    inputs = [i.name for i in graph.inputs] + [c.name for c in graph.constants]
    body = [f"KilnRef {', '.join(inputs)};"] if inputs else []
    body += [f"{name}.borrow(in[{k}]);" for k, name in enumerate(inputs)]
    bind, check = size_bindings(graph)
    body += bind + check
    if launcher is not None:
        body += launcher.prologue(inputs)
    names = sorted(set(renderer.buffers) - set(inputs) - set(arena.offsets))
    if names:
        body.append(f"KilnRef {', '.join(names)};")
    body += renderer.arena_allocation()
    reused = {old for p in plan.steps for old in p.reuse.values()}
    for i, (step, sp) in enumerate(zip(schedule.steps, plan.steps, strict=True)):
        for name in sp.allocate:
            body += renderer.allocate(name)
        for new, old in {**sp.reuse, **sp.in_place}.items():
            body += renderer.alias(new, old)
            if new in sp.reuse and old not in arena:
                body.append(f"{old}.reset();  // reused")
        if isinstance(step, Kernel):
            body += renderer.kernel(step)
        else:
            body += renderer.extern(step, out_filled.get(i, []))
        freed = [n for n in sp.free if n not in reused] + list(sp.in_place.values())
        body += [f"{n}.reset();" for n in dict.fromkeys(freed) if n not in arena]
    for k, out in enumerate(graph.outputs):
        body += renderer.output(k, out)
    body.append("return 0;")
    head = [
        "// the host program: kernels called directly, ATen ops through the runtime",
        "// (kiln_host.h)",
        f"#define KILN_EXTERNS {len(renderer.externs)}",
        f"#define KILN_FUNCTIONS {len(launcher.functions) if launcher else 0}",
        PRELUDE,
        *getattr(launcher, "declarations", list)(),  # what its launch lines use
        "namespace {",
        *renderer.layouts.lines(),
        "}  // namespace",
        "",
        'extern "C" int kiln_host_call(KilnTensor* const* in, KilnTensor** out) {',
    ]
    source = "\n".join(head + ["  " + line for line in body] + ["}", ""])
    return NativeHost(
        source,
        renderer.externs,
        len(inputs),
        len(graph.outputs),
        [i.name for i in graph.inputs],
        list(launcher.functions) if launcher else [],
        list(launcher.records) if launcher else [],
    )


class _Renderer:
    def __init__(
        self, buffers: dict[str, Buffer], layouts: _Layouts, runtime, read, launcher, arena: Arena
    ):
        self.buffers = buffers
        self.arena = arena
        self.launcher = launcher
        self.read = read  # buffers something reads: the extern results whose layout matters
        self.layouts = layouts
        self.runtime = runtime
        self.externs: list[ExternCall] = []
        self.temps = 0

    def _layout_args(self, size, stride) -> str:
        return f"{len(size)}, {self.layouts(size)}, {self.layouts(stride)}"

    def _empty(self, size, stride, dtype: torch.dtype, device: str) -> str:
        device_type, index = self.runtime.device_code(torch.device(device))
        return (
            f"kiln_api->empty_strided({self._layout_args(size, stride)}, "
            f"{self.runtime.scalar_type(dtype)}, {device_type}, {index})"
        )

    def arena_allocation(self) -> list[str]:
        """The one allocation the arena buffers live in (see :mod:`kiln_cpp.host.arena`)."""
        if not self.arena.offsets:
            return []
        block = self._empty((self.arena.size,), (1,), torch.uint8, self.arena.device)
        return [
            f"KilnRef kiln_arena_block;  // one block for {len(self.arena.offsets)} buffer(s)",
            f"if (!kiln_set(kiln_arena_block, {block})) return -1;",
            "char* const kiln_arena =",
            "    static_cast<char*>(kiln_api->data_ptr(kiln_arena_block.get()));",
        ]

    def pointer(self, name: str) -> str:
        """The C++ expression of buffer ``name``'s data pointer."""
        if name in self.arena:
            return f"(kiln_arena + {self.arena.offsets[name]})"
        return f"kiln_api->data_ptr({name}.get())"

    def allocate(self, name: str) -> list[str]:
        if name in self.arena:
            return []
        b = self.buffers[name]
        return [
            f"if (!kiln_set({name}, {self._empty(b.size, b.stride, b.dtype, b.device)})) return -1;"
        ]

    def alias(self, new: str, old: str) -> list[str]:
        if new in self.arena:
            return []
        b, o = self.buffers[new], self.buffers[old]
        if tuple(b.size) == tuple(o.size) and tuple(b.stride) == tuple(o.stride):
            return [f"{new}.reset(kiln_api->alias({old}.get()));"]
        return [f"if (!kiln_set({new}, {self.view(old, b.size, b.stride, 0)})) return -1;"]

    def view(self, base: str, size, stride, offset) -> str:
        return f"kiln_api->view({base}.get(), {self._layout_args(size, stride)}, {cexpr(offset)})"

    def kernel(self, kernel: Kernel) -> list[str]:
        if self.launcher is not None:
            return self.launcher.lines(kernel, self.pointer)
        args = [f"({pointer_type(kernel.arg_dtypes[a])}) {self.pointer(a)}" for a in kernel.args]
        args += [cexpr(s) for s in kernel.size_args]
        return [
            f"if ({kernel.name}({', '.join(args)})) {{",
            f'  kiln_api->index_error("{kernel.name}");',
            "  return -1;",
            "}",
        ]

    def tensor(self, ref: TensorRef, lines: list[str]) -> str:
        """The name holding ``ref``: its buffer, or a temporary view made in ``lines``."""
        b = self.buffers[ref.buffer]
        if ref.is_whole(b) and ref.buffer not in self.arena:
            return ref.buffer
        name = f"view{self.temps}"
        self.temps += 1
        lines.append(f"KilnRef {name};")
        if ref.buffer in self.arena:
            offset = cexpr(self.arena.offsets[ref.buffer] + ref.offset * b.dtype.itemsize)
            view = (
                f"kiln_api->arena_view(kiln_arena_block.get(), {offset}, "
                f"{self._layout_args(ref.size, ref.stride)}, {self.runtime.scalar_type(b.dtype)})"
            )
        else:
            view = self.view(ref.buffer, ref.size, ref.stride, ref.offset)
        lines.append(f"if (!kiln_set({name}, {view})) return -1;")
        return name

    def ref_pointer(self, ref: TensorRef) -> str:
        """The C++ expression of the data pointer of view ``ref`` (a static offset)."""
        offset = int(ref.offset) * ref.dtype.itemsize
        base = self.pointer(ref.buffer)
        return base if offset == 0 else f"(static_cast<char*>({base}) + {offset})"

    def product(self, node: ExternNode, out: str | None) -> list[str] | None:
        """``node`` as one cuBLASLt call (see :mod:`kiln_cpp.host.gemm`), or None."""
        call = gemm.gemm_call(node) if self.launcher is not None and out else None
        if call is None:
            return None
        try:
            call.prepare(self.runtime)
        except HostNotRendered:
            return None  # an ATen call, as for any other op
        index = len(self.externs)
        self.externs.append(call)
        a, b, *bias = (self.ref_pointer(r) for r in call.operands)
        pointers = ", ".join([a, b, bias[0] if bias else "nullptr", self.pointer(out)])
        return [
            *self.allocate(out),
            f"if (kiln_api->cuda_gemm(kiln_externs[{index}], kiln_stream, {pointers}))",
            "  return -1;  // " + call.op_name,
        ]

    def extern(self, node: ExternNode, filled: list[str]) -> list[str]:
        """The call of ``node``'s op; with ``filled`` (the buffer it fills), its ``out=``
        overload filling that buffer (no allocation by the op, no copy); or the launch of
        the launcher's kernel computing it into ``filled`` (its results, the first read)."""
        launch = getattr(self.launcher, "extern_lines", None)
        lines = launch(node, self.pointer, self.ref_pointer) if launch else None
        if lines is not None:
            return [line for name in filled for line in self.allocate(name)] + lines
        out = filled[0] if filled else None
        product = self.product(node, out)
        if product is not None:
            return product
        lines: list[str] = []
        if out is not None:
            lines += self.allocate(out)
            out = self.tensor(self.buffers[out].ref(), lines)
        call = extern_call(node, lambda ref: self.tensor(ref, lines), out, cexpr)
        call.prepare(self.runtime)
        index = len(self.externs)
        self.externs.append(call)
        tensors = ", ".join(f"{t}.get()" for t in call.tensors) or "nullptr"
        sizes = ", ".join(call.sizes) or "0"
        n = max(1, call.n_returns)
        lines += [
            "{",
            f"  KilnTensor* args[] = {{{tensors}}};",
            f"  const int64_t sizes[] = {{{sizes}}};",
            f"  KilnTensor* results[{n}] = {{}};",
            f"  int failed = kiln_api->call_extern(kiln_externs[{index}], args, sizes, results);",
        ]
        for i in range(call.n_returns):
            b = node.outputs[i] if i < len(node.outputs) else None
            lines.append(
                f"  {b.name}.reset(results[{i}]);"
                if b is not None
                else f"  kiln_api->release(results[{i}]);"
            )
        lines += ["  if (failed) return -1;", "}"]
        for b in node.outputs:
            # an output nothing reads is not checked: some ATen kernels leave one empty
            if b is None or b.name not in self.read or out is not None:
                continue
            what = f"{call.op_name} output {b.name}"
            match = (
                f"kiln_api->match_layout({b.name}.get(), "
                f'{self._layout_args(b.size, b.stride)}, "{what}")'
            )
            lines.append(f"if (!kiln_set({b.name}, {match})) return -1;")
        return lines

    def output(self, k: int, ref: TensorRef) -> list[str]:
        if ref.is_whole(self.buffers[ref.buffer]):
            return [f"out[{k}] = kiln_api->alias({ref.buffer}.get());"]
        view = self.view(ref.buffer, ref.size, ref.stride, ref.offset)
        return [f"if (!(out[{k}] = {view})) return -1;"]


def fills_out(step) -> str | None:
    """The buffer an extern step fills through its op's ``out=`` overload, if it does."""
    if not isinstance(step, ExternNode) or not isinstance(step.target, torch._ops.OpOverload):
        return None
    if len(step.outputs) != 1 or step.outputs[0] is None:
        return None
    if out_variant(step.target, step.outputs[0].device.type) is None:
        return None
    return step.outputs[0].name
