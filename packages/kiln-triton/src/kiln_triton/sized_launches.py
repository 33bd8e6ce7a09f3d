"""The native host program on CUDA for a graph whose sizes are symbols.

A kernel whose sizes are arguments is planned per size in Python (launch configuration,
grid, the compiled kernel of that size's specialization: see :mod:`kiln_triton.launcher`).
The C++ program plans a new size itself wherever a size of the same *family* ran before.
A kernel's family at a size is what its compiled kernel and configuration depend on:
Triton's specialization of each size and block count (whether it is 1, a multiple of 16,
within 32 bits) and each block count's power-of-two bucket (a persistent reduction holds
a row of the bucket's length). The program keeps, per kernel, a table of families: the
compiled kernel's handle, block and shared memory, which block counts make its grid and by
which blocks, and which values its parameters after the pointers take (sizes and block
counts, left out where Triton made one a constant; then the null scratch pointers newer
Triton appends). A call computes every kernel's sizes and block counts, finds each
kernel's family, and launches with the grid and parameters of that call. Where a kernel's
own family is not known, a family whose compiled kernel runs it serves: one of the same
buckets that assumed no more of each value than holds (a kernel compiled for sizes that
are not multiples of 16 runs one that is).

A call where some kernel's family is not known yet (or whose indices would need 64 bits)
is handed to the Python host program before anything runs; it plans and launches the
call, then :class:`FamilyTable` *learns* each kernel's family from its plan. At most
``FAMILIES`` families are kept per kernel (the oldest learned goes first). A launch the
table cannot hold (a split reduction, a kernel without a direct launch) stays with the
Python program.
"""

from __future__ import annotations

import ctypes
import logging
import math

import sympy

from kiln_cpp.prelude import SIZE_FUNCTIONS
from kiln_cpp.printer import cexpr
from kiln_loopir.host import HostNotRendered, size_sources
from kiln_loopir.kernel import Kernel, Schedule
from kiln_triton.compiled_launch import ptx_params, unlaunchable
from kiln_triton.launcher import INT32_LIMIT, TritonKernel, size_specialization
from kiln_triton.render import block_counts
from kiln_triton.variants import SPECIALIZE_SIZES

log = logging.getLogger("kiln.triton")

FAMILIES = 32  # families a program keeps per kernel
SPARE_SLOTS = 4  # room for the scratch pointers (and any constant) after sizes and numels
INT_KINDS = ("i32", "u32", "i64", "u64")  # parameters a family passes: sizes, block counts
# the bits of a specialization (launcher.size_specialization) that Triton compiles in: 1, a
# multiple of 16, 32 bits; only the last where sizes are not specialized
SPECIALIZED = 0b111 if SPECIALIZE_SIZES else 0b100

DECLARATIONS = """\
#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln {{  // what size expressions call
{size_functions}
}}  // namespace kiln

namespace {{
constexpr int KILN_KERNELS = {kernels};
constexpr int KILN_KEY = {key};  // the longest family key of a kernel
constexpr int KILN_POINTERS = {pointers};  // the most tensors one kernel takes
constexpr int KILN_SLOTS = {slots};
constexpr int KILN_FAMILIES = {families};
constexpr int64_t KILN_INT32_LIMIT = {int32_limit};  // beyond it, indices take 64 bits
constexpr int64_t KILN_SPECIALIZED = {specialized};  // what Triton compiles in (see below)

// one kernel's launch at every size of one family
struct KilnFamily {{
  int64_t key[KILN_KEY];
  void* function;
  uint32_t block;
  uint32_t shared;
  int32_t grid_value[2];  // the block counts whose blocks make the grid (-1: none)
  int64_t grid_block[2];
  uint32_t n_slots;
  int32_t slot_value[KILN_SLOTS];  // the value each parameter after the pointers takes
                                   // (-1: a null pointer)
}};

struct KilnFamilies {{
  KilnFamily family[KILN_FAMILIES];
  int known;  // families learned (at most KILN_FAMILIES)
  int next;   // where the next one learned goes
}};

KilnFamilies kiln_families[KILN_KERNELS];

// what Triton's compile assumes of an integer: whether it is 1, a multiple of 16, 32-bit
// (of those, what KILN_SPECIALIZED keeps: all three, or 32 bits alone)
int64_t kiln_specialized(int64_t n) {{
  return ((n == 1) | ((n % 16 == 0) << 1) | ((n >= INT32_MIN && n <= INT32_MAX) << 2)) &
         KILN_SPECIALIZED;
}}

// the power-of-two bucket of a block count: the bits of n - 1
int64_t kiln_bucket(int64_t n) {{
  return n <= 1 ? 0 : 64 - __builtin_clzll(static_cast<uint64_t>(n - 1));
}}

// whether family f's kernel runs values of key: what it was compiled to assume of each
// value (1, a multiple of 16, 32 bits) holds of them, and its buckets are theirs
bool kiln_runs(const KilnFamily& f, const int64_t* key, int n) {{
  for (int i = 0; i < n; ++i)
    if (f.key[i] & ~key[i]) return false;
  for (int i = n; i < KILN_KEY; ++i)
    if (f.key[i] != key[i]) return false;
  return true;
}}

// the family of kernel k at its values v (sizes, then block counts): its own where it was
// learned, else one whose kernel runs them; null where none, or where the block counts
// need 64-bit indices
const KilnFamily* kiln_find_family(int k, const int64_t* v, int n_sizes, int n_numels) {{
  int64_t key[KILN_KEY] = {{0}};
  int64_t points = 1;
  const int n = n_sizes + n_numels;
  for (int i = 0; i < n; ++i) key[i] = kiln_specialized(v[i]);
  for (int j = 0; j < n_numels; ++j) {{
    key[n + j] = kiln_bucket(v[n_sizes + j]);
    points *= std::max<int64_t>(v[n_sizes + j], 1);
  }}
  if (points > KILN_INT32_LIMIT) return nullptr;
  const KilnFamilies& t = kiln_families[k];
  const KilnFamily* runs = nullptr;
  for (int i = 0; i < t.known; ++i) {{
    if (std::memcmp(t.family[i].key, key, sizeof(key)) == 0) return &t.family[i];
    if (runs == nullptr && kiln_runs(t.family[i], key, n)) runs = &t.family[i];
  }}
  return runs;
}}

// launch f at values v; null f: nothing to compute at this size
int kiln_launch_family(void* stream, const KilnFamily* f, void** pointers, int n,
                       const int64_t* v) {{
  if (f == nullptr) return 0;
  int64_t grid = 1;
  for (int g = 0; g < 2; ++g)
    if (f->grid_value[g] >= 0)
      grid *= (v[f->grid_value[g]] + f->grid_block[g] - 1) / f->grid_block[g];
  int64_t slots[KILN_SLOTS];
  void* params[KILN_POINTERS + KILN_SLOTS];
  for (int i = 0; i < n; ++i) params[i] = &pointers[i];
  for (uint32_t j = 0; j < f->n_slots; ++j) {{
    slots[j] = f->slot_value[j] < 0 ? 0 : v[f->slot_value[j]];
    params[n + j] = &slots[j];
  }}
  return kiln_api->cuda_launch(stream, f->function, static_cast<uint32_t>(grid), 1, 1,
                               f->block, f->shared, params);
}}
}}  // namespace

// a family of kernel k's launches, planned by the Python host program (FamilyTable)
extern "C" void kiln_host_learn_family(int k, const KilnFamily* family) {{
  KilnFamilies& t = kiln_families[k];
  t.family[t.next] = *family;
  t.next = (t.next + 1) % KILN_FAMILIES;
  if (t.known < KILN_FAMILIES) ++t.known;
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


def family_key(values: tuple[int, ...], numels: tuple[int, ...], length: int) -> tuple:
    """The family of a kernel at ``values`` (its sizes, then its block counts ``numels``),
    as ``kiln_find_family`` computes it: each value's specialization, each block count's
    power-of-two bucket, zeros up to ``length``."""
    specialized = [sum(bit << i for i, bit in enumerate(size_specialization(n))) for n in values]
    buckets = [0 if n <= 1 else (n - 1).bit_length() for n in numels]
    return tuple(specialized + buckets + [0] * (length - len(specialized) - len(buckets)))


class SizedLauncher:
    """What :func:`kiln_cpp.host.render_host` asks of a kernel launcher, for a graph whose
    sizes are symbols: every kernel's family found before anything runs, each launch
    planned from it."""

    functions: tuple[int, ...] = ()  # kernel handles come with each family, not at load

    def __init__(self, schedule: Schedule, kernels: dict[str, TritonKernel]) -> None:
        graph = schedule.graph
        sources = size_sources(graph)
        if any(attr is None for _, _, attr, _ in sources):
            raise HostNotRendered("a size is an input number, not an input's size")
        inputs = [i.name for i in graph.inputs] + [c.name for c in graph.constants]
        self.kernels: list[Kernel] = list(schedule.kernels())
        self.numels = [_block_counts(k, kernels[k.name]) for k in self.kernels]
        self.key = max((len(k.size_args) + 2 * len(n) for k, n in self._each()), default=1)
        self.slots = SPARE_SLOTS + max((len(k.size_args) + len(n) for k, n in self._each()),
                                       default=0)  # fmt: skip
        self.pointer_args = {name for k in self.kernels for name in k.args}
        self.spans = _spans(graph.buffers(), self.pointer_args)
        self.records = [
            {
                "sized": {
                    "symbols": [
                        [str(sym), inputs.index(name), attr, d] for sym, name, attr, d in sources
                    ],
                    "kernels": [
                        [k.name, len(k.args), [str(s) for s in k.size_args]] for k in self.kernels
                    ],
                    "key": self.key,
                    "slots": self.slots,
                }
            }
        ]
        self._index = {k.name: i for i, k in enumerate(self.kernels)}

    def _each(self):
        return zip(self.kernels, self.numels, strict=True)

    def declarations(self) -> list[str]:
        pointers = max((len(k.args) for k in self.kernels), default=0)
        return DECLARATIONS.format(
            kernels=max(len(self.kernels), 1), key=self.key, pointers=max(pointers, 1),
            slots=self.slots, families=FAMILIES, int32_limit=INT32_LIMIT,
            specialized=SPECIALIZED, size_functions=SIZE_FUNCTIONS.strip(),
        ).splitlines()  # fmt: skip

    def prologue(self, inputs: list[str]) -> list[str]:
        lines = alignment_checks(inputs, self.pointer_args)
        if self.spans:
            lines += [
                f"if (std::max<int64_t>({{{', '.join(self.spans)}}}) > KILN_INT32_LIMIT)",
                "  return KILN_RUN_PYTHON;  // indices of 64 bits",
            ]
        for i, (kernel, numels) in enumerate(self._each()):
            values = [cexpr(s) for s in kernel.size_args] + [cexpr(n) for n in numels.values()]
            first = len(kernel.size_args)
            empty = " || ".join(
                f"kiln_v{i}[{first + j}] == 0" for j, name in enumerate(numels) if name != "rnumel"
            )
            lines += [
                f"const int64_t kiln_v{i}[] = {{{', '.join(values)}}};  // {kernel.name}",
                f"const KilnFamily* kiln_f{i} = nullptr;  // null: nothing to compute",
                f"if (!({empty})) {{",
                f"  kiln_f{i} = kiln_find_family({i}, kiln_v{i}, {first}, {len(numels)});",
                f"  if (kiln_f{i} == nullptr) return KILN_RUN_PYTHON;  // a family not learned",
                "}",
            ]
        return lines + ["void* kiln_stream = kiln_api->cuda_stream();"]

    def lines(self, kernel: Kernel, pointer) -> list[str]:
        pointers = ", ".join(pointer(name) for name in kernel.args)
        i = self._index[kernel.name]
        return [
            "{",
            f"  void* pointers[] = {{{pointers}}};",
            f"  if (kiln_launch_family(kiln_stream, kiln_f{i}, pointers, {len(kernel.args)}, "
            f"kiln_v{i}))",
            "    return -1;",
            f"}}  // {kernel.name}",
        ]

    def computes(self, node, read) -> None:
        return None  # no kernel of Kiln's in place of an ATen op at symbolic sizes


def _block_counts(kernel: Kernel, fn: TritonKernel) -> dict[str, sympy.Expr]:
    numels = block_counts(kernel)
    if list(numels) != list(fn.meta["numels"]):
        raise HostNotRendered(f"{kernel.name}'s block counts are not its source's")
    return numels


def _spans(buffers: dict, names: set[str]) -> list[str]:
    """C++ of how many elements each buffer a kernel takes spans, where that depends on
    the sizes (the kernels index in 32 bits while these and their block counts fit)."""
    spans: dict[str, None] = {}  # each expression once
    for name in sorted(names):
        b = buffers.get(name)
        if b is None:
            raise HostNotRendered(f"{name}, which a kernel takes, has no layout")
        span = 1 + sum((sympy.sympify(n) - 1) * st for n, st in zip(b.size, b.stride, strict=True))
        span = sympy.expand(span)
        if span.free_symbols:
            spans[cexpr(span)] = None
        elif span > INT32_LIMIT:
            raise HostNotRendered(f"{name} needs 64-bit indices at every size")
    return list(spans)


class LaunchRefused(Exception):
    """A launch the table cannot hold; ``lasting``: whether it stays so in its family."""

    def __init__(self, reason: str, lasting: bool = True) -> None:
        super().__init__(reason)
        self.lasting = lasting


class FamilyTable:
    """Learns families into a loaded sized host program: ``learn(inputs)`` after the
    Python host program ran a call the native one handed back (``inputs``: every input,
    the graph's constants last). ``handed_back`` counts those calls, ``learned`` the
    families learned from them."""

    def __init__(self, record: dict, kernels: dict[str, TritonKernel], library) -> None:
        self.names = [name for name, *_ in record["symbols"]]
        self.symbols = [tuple(where) for _, *where in record["symbols"]]
        self.kernels = [(kernels[name], n, names) for name, n, names in record["kernels"]]
        self.key, self.slots = record["key"], record["slots"]
        self.family_type = type(
            "KilnFamily",
            (ctypes.Structure,),
            {
                "_fields_": [
                    ("key", ctypes.c_int64 * self.key),
                    ("function", ctypes.c_void_p),
                    ("block", ctypes.c_uint32),
                    ("shared", ctypes.c_uint32),
                    ("grid_value", ctypes.c_int32 * 2),
                    ("grid_block", ctypes.c_int64 * 2),
                    ("n_slots", ctypes.c_uint32),
                    ("slot_value", ctypes.c_int32 * self.slots),
                ]
            },
        )
        self._learn = library.kiln_host_learn_family
        self._learn.argtypes = [ctypes.c_int, ctypes.POINTER(self.family_type)]
        self._learn.restype = None
        self.library = library  # kept loaded while the table lives
        self.refused: dict[tuple, str] = {}  # (kernel, family) the table cannot hold, and why
        # per kernel, its families' compiled kernels in the program's order of replacement:
        # a family's kernel handle stays valid while it may be launched
        self.known: list[dict[tuple, object]] = [{} for _ in self.kernels]
        self.handed_back = 0
        self.learned = 0

    def __call__(self, inputs) -> None:
        self.handed_back += 1
        values = {
            name: int(getattr(inputs[i], attr)(d))
            for name, (i, attr, d) in zip(self.names, self.symbols, strict=True)
        }
        for index, (fn, n_tensors, names) in enumerate(self.kernels):
            sizes = tuple(values[n] for n in names)
            launch = fn._launches.get(sizes, False)
            if launch is None or launch is False:  # nothing to compute, or not planned
                continue
            key = family_key((*sizes, *launch.numels), launch.numels, self.key)
            if key in self.known[index] or (index, key) in self.refused:
                continue
            try:
                family = self._family(key, fn, launch, sizes, n_tensors)
            except LaunchRefused as exc:
                if exc.lasting:
                    self._refuse((index, key), str(exc), fn)
                continue
            self._learn(index, ctypes.byref(family))  # the program's ring of families
            known = self.known[index]
            if len(known) >= FAMILIES:
                del known[next(iter(known))]
            known[key] = launch.compiled
            self.learned += 1

    def _refuse(self, where: tuple, reason: str, fn: TritonKernel) -> None:
        if len(self.refused) >= 16 * FAMILIES:  # the oldest refusal goes first
            del self.refused[next(iter(self.refused))]
        self.refused[where] = reason
        if len(self.refused) == 1:  # once per program
            log.info("%s stays with the Python host program at some sizes: %s", fn.name, reason)

    def _family(self, key: tuple, fn: TritonKernel, launch, sizes: tuple, n_tensors: int):
        """The family entry ``key`` of ``fn`` from its planned ``launch`` at ``sizes``."""
        if launch.split is not None:
            raise LaunchRefused("a split reduction")
        compiled = launch.compiled
        if launch.runner is None or compiled is None:
            raise LaunchRefused("no direct launch yet", lasting=False)
        if launch.kwargs.get("INDEX64"):
            raise LaunchRefused("64-bit indices", lasting=False)
        meta = compiled.metadata
        reason = unlaunchable(meta)
        if reason is not None:
            raise LaunchRefused(reason)
        values = (*sizes, *launch.numels)
        family = self.family_type()
        family.key[:] = key
        family.function = int(compiled.function)
        family.block = 32 * meta.num_warps
        family.shared = meta.shared
        grid = _grid_of(fn.meta, dict(launch.config.blocks), len(sizes))
        family.grid_value[:] = [g for g, _ in grid] + [-1] * (2 - len(grid))
        family.grid_block[:] = [b for _, b in grid] + [1] * (2 - len(grid))
        if math.prod(-(-values[g] // b) for g, b in grid) != launch.grid[0]:
            raise LaunchRefused(f"a grid of {launch.grid} from other block counts")
        slots = _slot_values(launch, len(values), n_tensors)
        if len(slots) > self.slots:
            raise LaunchRefused(f"{len(slots)} parameters after the pointers")
        family.n_slots = len(slots)
        family.slot_value[: len(slots)] = slots
        return family


def _grid_of(meta: dict, blocks: dict, first: int) -> list[tuple[int, int]]:
    """``(value index, block)`` of each block count the grid divides: a tiled kernel's
    ``ynumel`` and ``xnumel``, else ``xnumel`` (``first``: where the block counts start
    among the kernel's values)."""
    names = list(meta["numels"])
    grid = [(first + names.index("xnumel"), blocks["XBLOCK"])]
    if meta["kind"] == "tiled":
        grid.insert(0, (first + names.index("ynumel"), blocks["YBLOCK"]))
    return grid


def _slot_values(launch, n_values: int, n_tensors: int) -> list[int]:
    """Which of the kernel's values (its sizes, then its block counts) each parameter of
    ``launch.compiled`` after its pointers takes; -1 for each null scratch pointer its PTX
    appends."""
    compiled = launch.compiled
    names = list(launch.fn.arg_names)
    pointers, slots = 0, []
    for key, kind in dict(compiled.src.signature).items():
        position = key if isinstance(key, int) else names.index(key)
        if kind == "constexpr":
            continue
        if kind.startswith("*"):
            if slots or pointers == n_tensors:
                raise LaunchRefused(f"pointer parameter {names[position]} after the tensors")
            pointers += 1
            continue
        if kind not in INT_KINDS:
            raise LaunchRefused(f"a parameter of type {kind}")
        if not n_tensors <= position < n_tensors + n_values:
            raise LaunchRefused(f"parameter {names[position]} is not a size or block count")
        slots.append(position - n_tensors)
    if pointers != n_tensors:
        raise LaunchRefused(f"{pointers} pointer parameters for {n_tensors} tensors")
    counted = ptx_params(compiled)
    if counted is None:
        raise LaunchRefused("no entry point in PTX to count the kernel's parameters in")
    return slots + [-1] * (counted - pointers - len(slots))
