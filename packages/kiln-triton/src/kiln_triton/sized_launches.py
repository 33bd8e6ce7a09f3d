"""The native host program on CUDA for a graph whose sizes are symbols.

A kernel whose sizes are arguments is planned per size in Python (launch configuration,
grid, the compiled kernel of that size's specialization: see :mod:`kiln_triton.launcher`).
The C++ host program does not plan: it keeps a table with one entry per size of the graph
(the values of its size symbols, bound from the inputs), holding for every kernel the
compiled kernel's handle, its grid, block and shared memory, and its launch parameters
after the pointers (sizes and block counts at the width the compiled kernel takes them,
left out where Triton made them constants; the null scratch pointers newer Triton
appends).

A call at a size the table does not hold is handed to the Python host program, which
plans and launches it; then :class:`SizeTable` *learns* the size from the kernels' plans,
and the next call at it launches from the table. At most ``SIZES`` sizes are kept (the
oldest learned goes first). A size whose launches the table cannot hold (a split
reduction, a kernel without a direct launch) stays with the Python program.
"""

from __future__ import annotations

import ctypes
import logging
import struct

import sympy

from kiln_cpp.prelude import SIZE_FUNCTIONS
from kiln_loopir.host import HostNotRendered, size_sources
from kiln_loopir.kernel import Kernel, Schedule
from kiln_triton.compiled_launch import ptx_params, unlaunchable
from kiln_triton.launcher import TritonKernel

log = logging.getLogger("kiln.triton")

SIZES = 256  # sizes a program keeps
SPARE_SLOTS = 4  # room for the scratch pointers (and any constant) after sizes and numels

DECLARATIONS = """\
#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln {{  // what size expressions call
{size_functions}
}}  // namespace kiln

namespace {{
constexpr int KILN_SYMBOLS = {symbols};
constexpr int KILN_LAUNCHES = {launches};
constexpr int KILN_POINTERS = {pointers};  // the most tensors one kernel takes
constexpr int KILN_SLOTS = {slots};
constexpr int KILN_SIZES = {sizes};

// one kernel's launch at one size; each parameter after the pointers is a slot holding
// an int32, int64, float or double in its first bytes
struct KilnSizedLaunch {{
  void* function;  // null: nothing to compute at this size
  uint32_t grid[3];
  uint32_t block;
  uint32_t shared;
  uint32_t n_slots;
  int64_t slots[KILN_SLOTS];
}};

struct KilnSize {{
  int64_t key[KILN_SYMBOLS];  // the size symbols' values
  KilnSizedLaunch launches[KILN_LAUNCHES];
}};

KilnSize kiln_sizes[KILN_SIZES];
int kiln_known = 0;  // sizes learned (at most KILN_SIZES)
int kiln_next = 0;   // where the next one learned goes

const KilnSize* kiln_find_size(const int64_t* key) {{
  for (int i = 0; i < kiln_known; ++i)
    if (std::memcmp(kiln_sizes[i].key, key, sizeof(kiln_sizes[i].key)) == 0)
      return &kiln_sizes[i];
  return nullptr;
}}

int kiln_launch_sized(void* stream, const KilnSizedLaunch& k, void** pointers, int n) {{
  if (k.function == nullptr) return 0;
  void* params[KILN_POINTERS + KILN_SLOTS];
  for (int i = 0; i < n; ++i) params[i] = &pointers[i];
  for (uint32_t j = 0; j < k.n_slots; ++j) params[n + j] = const_cast<int64_t*>(&k.slots[j]);
  return kiln_api->cuda_launch(stream, k.function, k.grid[0], k.grid[1], k.grid[2], k.block,
                               k.shared, params);
}}
}}  // namespace

// a size's launches, planned by the Python host program (SizeTable.learn)
extern "C" void kiln_host_learn_size(const KilnSize* size) {{
  kiln_sizes[kiln_next] = *size;
  kiln_next = (kiln_next + 1) % KILN_SIZES;
  if (kiln_known < KILN_SIZES) ++kiln_known;
}}
"""


def is_sized(schedule: Schedule) -> bool:
    """Whether any buffer of ``schedule``'s graph has a symbolic size or stride."""
    return any(
        sympy.sympify(e).free_symbols
        for b in schedule.graph.buffers().values()
        for e in (*b.size, *b.stride)
    )


def alignment_checks(inputs: list[str], pointer_args: set[str]) -> list[str]:
    """C++ handing the call to the Python host program where an input a kernel takes is
    not 16-byte aligned, as the kernels were compiled to assume."""
    lines = []
    for name in inputs:
        if name in pointer_args:
            lines += [
                f"if (reinterpret_cast<uintptr_t>(kiln_api->data_ptr({name}.get())) & 15)",
                "  return KILN_RUN_PYTHON;",
            ]
    return lines


class SizedLauncher:
    """What :func:`kiln_cpp.host.render_host` asks of a kernel launcher, for a graph whose
    sizes are symbols: each launch read from the table entry of the call's size."""

    functions: tuple[int, ...] = ()  # kernel handles come with each size, not at load

    def __init__(self, schedule: Schedule, kernels: dict[str, TritonKernel]) -> None:
        graph = schedule.graph
        sources = size_sources(graph)
        if any(attr is None for _, _, attr, _ in sources):
            raise HostNotRendered("a size is an input number, not an input's size")
        inputs = [i.name for i in graph.inputs] + [c.name for c in graph.constants]
        self.symbols = [str(sym) for sym, *_ in sources]
        self.kernels: list[Kernel] = list(schedule.kernels())
        self.slots = SPARE_SLOTS + max(
            (len(k.size_args) + len(kernels[k.name].meta["numels"]) for k in self.kernels),
            default=0,
        )
        self.pointer_args = {name for k in self.kernels for name in k.args}
        self.records = [
            {
                "sized": {
                    "symbols": [
                        [str(sym), inputs.index(name), attr, d] for sym, name, attr, d in sources
                    ],
                    "kernels": [
                        [k.name, len(k.args), [str(s) for s in k.size_args]] for k in self.kernels
                    ],
                    "slots": self.slots,
                }
            }
        ]
        self._slot_of = {k.name: i for i, k in enumerate(self.kernels)}

    def declarations(self) -> list[str]:
        pointers = max((len(k.args) for k in self.kernels), default=0)
        return DECLARATIONS.format(
            symbols=len(self.symbols), launches=max(len(self.kernels), 1),
            pointers=max(pointers, 1), slots=self.slots, sizes=SIZES,
            size_functions=SIZE_FUNCTIONS.strip(),
        ).splitlines()  # fmt: skip

    def prologue(self, inputs: list[str]) -> list[str]:
        return alignment_checks(inputs, self.pointer_args) + [
            f"const int64_t kiln_key[] = {{{', '.join(self.symbols)}}};",
            "const KilnSize* const kiln_size = kiln_find_size(kiln_key);",
            "if (kiln_size == nullptr) return KILN_RUN_PYTHON;  // a size not learned yet",
            "void* kiln_stream = kiln_api->cuda_stream();",
        ]

    def lines(self, kernel: Kernel, pointer) -> list[str]:
        pointers = ", ".join(pointer(name) for name in kernel.args)
        slot = self._slot_of[kernel.name]
        return [
            "{",
            f"  void* pointers[] = {{{pointers}}};",
            f"  if (kiln_launch_sized(kiln_stream, kiln_size->launches[{slot}], pointers, "
            f"{len(kernel.args)}))",
            "    return -1;",
            f"}}  // {kernel.name}",
        ]

    def computes(self, node, read) -> None:
        return None  # no kernel of Kiln's in place of an ATen op at symbolic sizes


class LaunchRefused(Exception):
    """A launch the table cannot hold; ``lasting``: whether it stays so at that size."""

    def __init__(self, reason: str, lasting: bool = True) -> None:
        super().__init__(reason)
        self.lasting = lasting


class SizeTable:
    """Learns sizes into a loaded sized host program: ``learn(inputs)`` after the Python
    host program ran a call the native one handed back (``inputs``: every input, the
    graph's constants last). ``handed_back`` counts those calls, ``learned`` the sizes
    learned from them."""

    def __init__(self, record: dict, kernels: dict[str, TritonKernel], library) -> None:
        self.names = [name for name, *_ in record["symbols"]]
        self.symbols = [tuple(where) for _, *where in record["symbols"]]
        self.kernels = [(kernels[name], n, names) for name, n, names in record["kernels"]]
        self.slots = record["slots"]
        launch_type = type(
            "KilnSizedLaunch",
            (ctypes.Structure,),
            {
                "_fields_": [
                    ("function", ctypes.c_void_p),
                    ("grid", ctypes.c_uint32 * 3),
                    ("block", ctypes.c_uint32),
                    ("shared", ctypes.c_uint32),
                    ("n_slots", ctypes.c_uint32),
                    ("slots", ctypes.c_int64 * self.slots),
                ]
            },
        )
        self.size_type = type(
            "KilnSize",
            (ctypes.Structure,),
            {
                "_fields_": [
                    ("key", ctypes.c_int64 * len(self.symbols)),
                    ("launches", launch_type * max(len(self.kernels), 1)),
                ]
            },
        )
        self._learn = library.kiln_host_learn_size
        self._learn.argtypes = [ctypes.POINTER(self.size_type)]
        self._learn.restype = None
        self.library = library  # kept loaded while the table lives
        self.refused: dict[tuple, str] = {}  # sizes the table cannot hold, and why
        # the compiled kernels of each entry, in the program's order of replacement: an
        # entry's kernel handles stay valid while it may be launched
        self._held: list[list | None] = [None] * SIZES
        self.handed_back = 0
        self.learned = 0

    def __call__(self, inputs) -> None:
        self.handed_back += 1
        key = tuple(int(getattr(inputs[i], attr)(d)) for i, attr, d in self.symbols)
        if key in self.refused:
            return
        try:
            entry, compiled = self._entry(key)
        except LaunchRefused as exc:
            if exc.lasting:
                if len(self.refused) >= 16 * SIZES:  # the oldest refusal goes first
                    del self.refused[next(iter(self.refused))]
                self.refused[key] = str(exc)
                if len(self.refused) == 1:  # once per program
                    log.info("sizes %s stay with the Python host program: %s", key, exc)
            return
        self._learn(ctypes.byref(entry))  # the program's slot learned % SIZES
        self._held[self.learned % SIZES] = compiled
        self.learned += 1

    def _entry(self, key: tuple) -> tuple[object, list]:
        """The table entry of size ``key`` and the compiled kernels it launches."""
        entry, compiled = self.size_type(), []
        entry.key[:] = key
        values = dict(zip(self.names, key, strict=True))
        for slot, (fn, n_tensors, names) in enumerate(self.kernels):
            sizes = tuple(values[n] for n in names)
            launch = fn._launches.get(sizes, False)
            if launch is False:
                raise LaunchRefused(f"{fn.name} has no plan at {sizes}", lasting=False)
            if launch is not None:  # None: nothing to compute at these sizes
                _fill(entry.launches[slot], launch, sizes, n_tensors, self.slots)
                compiled.append(launch.compiled)
        return entry, compiled


def _fill(target, launch, sizes: tuple, n_tensors: int, max_slots: int) -> None:
    """``target`` (a ``KilnSizedLaunch``) from a planned :class:`~kiln_triton.launcher.Launch`."""
    if launch.split is not None:
        raise LaunchRefused("a split reduction")
    compiled = launch.compiled
    if launch.runner is None or compiled is None:
        raise LaunchRefused("no direct launch yet", lasting=False)
    meta = compiled.metadata
    reason = unlaunchable(meta)
    if reason is not None:
        raise LaunchRefused(reason)
    slots = _slots(launch, sizes, n_tensors)
    if len(slots) > max_slots:
        raise LaunchRefused(f"{len(slots)} parameters after the pointers")
    target.function = int(compiled.function)
    target.grid[:] = (*launch.grid, 1, 1)[:3]
    target.block = 32 * meta.num_warps
    target.shared = meta.shared
    target.n_slots = len(slots)
    target.slots[: len(slots)] = slots


def _slots(launch, sizes: tuple, n_tensors: int) -> list[int]:
    """The launch parameters of ``launch.compiled`` after its pointers, each as the int64
    whose first bytes hold it; then its PTX's null scratch pointers."""
    compiled = launch.compiled
    names = list(launch.fn.arg_names)
    values = dict(zip(names[n_tensors:], (*sizes, *launch.numels), strict=False))
    values.update({n: launch.kwargs[n] for n in names if n in launch.kwargs})
    pointers, slots = 0, []
    for key, kind in dict(compiled.src.signature).items():
        name = names[key] if isinstance(key, int) else key
        if kind == "constexpr":
            continue
        if kind.startswith("*"):
            if slots or pointers == n_tensors:
                raise LaunchRefused(f"pointer parameter {name} after the tensors")
            pointers += 1
            continue
        slots.append(_slot(kind, values[name]))
    if pointers != n_tensors:
        raise LaunchRefused(f"{pointers} pointer parameters for {n_tensors} tensors")
    counted = ptx_params(compiled)
    if counted is None:
        raise LaunchRefused("no entry point in PTX to count the kernel's parameters in")
    return slots + [0] * (counted - pointers - len(slots))


def _slot(kind: str, value) -> int:
    if kind in ("i32", "u32", "i64"):
        return int(value)
    if kind == "u64":
        v = int(value)
        return v - 2**64 if v >= 2**63 else v
    if kind == "fp32":
        return struct.unpack("<i", struct.pack("<f", float(value)))[0]
    if kind == "fp64":
        return struct.unpack("<q", struct.pack("<d", float(value)))[0]
    raise LaunchRefused(f"a parameter of type {kind}")
