"""What a sized host program's families learn from the Python program's plans, and how its
C++ plans a launch from them (without a GPU: the launches and their compiled kernels stand
in, and the C++ tables are built with a launch that records what it is given; the GPU
entry point runs the program itself,
``test_gpu.py::test_native_host_program_learns_the_families_of_new_sizes``)."""

import ctypes
import shutil
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import sympy
import torch

import kiln_cpp
from kiln_triton.configs import Config
from kiln_triton.launcher import INT32_LIMIT, TritonKernel, runs_at
from kiln_triton.sized_launches import DECLARATIONS, FAMILIES, FamilyTable, family_key


@pytest.fixture(autouse=True)
def specialized_sizes(monkeypatch):
    """These tests read keys of sizes specialized as Triton does by default, whatever
    ``KILN_TRITON_SPECIALIZE_SIZES`` says (the last one turns it off)."""
    import kiln_triton.launcher as launcher
    import kiln_triton.sized_launches as sized_launches
    import kiln_triton.variants as variants

    monkeypatch.setattr(variants, "SPECIALIZE_SIZES", True)
    monkeypatch.setattr(launcher, "SPECIALIZE_SIZES", True)
    monkeypatch.setattr(sized_launches, "SPECIALIZED", 0b111)


PTX = ".visible .entry k(.param .u64 p0, .param .u64 p1, .param .u32 p2, .param .u64 p3)"
ARGS = ["in_ptr0", "out_ptr0", "s0", "xnumel", "XBLOCK", "INDEX64"]
SIGNATURE = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "s0": "i32", "xnumel": "constexpr"}


def _compiled(function: int, signature: dict):
    return SimpleNamespace(
        function=function,
        metadata=SimpleNamespace(num_warps=4, shared=128),
        src=SimpleNamespace(signature=signature),
        asm={"ptx": PTX},
        hash=f"k{function}",
    )


def _launch(function: int, s0: int, signature: dict = SIGNATURE, xblock: int = 128):
    """The plan of a pointwise kernel over ``s0`` x 2 points (``xnumel = 2 * s0``)."""
    return SimpleNamespace(
        split=None,
        runner=object(),
        compiled=_compiled(function, signature),
        fn=SimpleNamespace(arg_names=ARGS),
        numels=(2 * s0,),
        kwargs={"XBLOCK": xblock, "INDEX64": False},
        grid=(-(-2 * s0 // xblock),),
        config=SimpleNamespace(blocks=(("XBLOCK", xblock),)),
    )


def _kernel(launches: dict):
    meta = {"kind": "pointwise", "numels": {"xnumel": "2*s0"}}
    return SimpleNamespace(name="kernel0", meta=meta, _launches=launches)


class Library:
    """Stands in for the program's library: keeps what ``kiln_host_learn_family`` got."""

    def __init__(self):
        self.entries = []

        def learn(kernel, family):  # given ctypes.byref(family)
            self.entries.append((kernel, family._obj))

        self.kiln_host_learn_family = learn


RECORD = {"symbols": [["s0", 0, "size", 0]], "kernels": [["kernel0", 2, ["s0"]]], "key": 3}


def _table(kernel, library=None):
    return FamilyTable({**RECORD, "slots": 6}, {"kernel0": kernel}, library or Library())


def test_a_family_is_learned_from_the_kernels_plan():
    kernel = _kernel({(40,): _launch(7, 40)})
    table = _table(kernel)
    table((torch.randn(40, 8),))
    assert (table.handed_back, table.learned) == (1, 1)
    ((index, family),) = table.library.entries
    # s0 = 40: 32-bit, not 1 nor a multiple of 16; xnumel = 80: 32-bit, a multiple of 16,
    # in the bucket of 128 (7 bits)
    assert index == 0 and list(family.key) == [0b100, 0b110, 7]
    assert family.function == 7 and (family.block, family.shared) == (128, 128)
    # the grid divides xnumel (value 1) by XBLOCK
    assert list(family.grid_value) == [1, -1] and list(family.grid_block) == [128, 1]
    # s0 (value 0) at 32 bits (xnumel was made a constant), then the PTX's scratch pointer
    assert family.n_slots == 2 and list(family.slot_value[:2]) == [0, -1]
    assert table.known[0] == {tuple(family.key): kernel._launches[(40,)].compiled}


def test_a_size_of_a_known_family_is_not_learned_again():
    kernel = _kernel({(40,): _launch(7, 40), (56,): _launch(7, 56), (80,): _launch(8, 80)})
    table = _table(kernel)
    for rows in (40, 56, 80):
        table((torch.randn(rows, 2),))
    assert table.handed_back == 3
    # 56 is in 40's family (xnumel 112 and 80); 80 is a multiple of 16, its 160 in another
    # bucket
    assert table.learned == 2
    assert [e[1].function for e in table.library.entries] == [7, 8]


def test_family_keys_follow_tritons_specialization_and_the_buckets():
    assert family_key((1, 16, 17), (16, 17), 7) == (0b101, 0b110, 0b100, 4, 5, 0, 0)
    assert family_key((2**31,), (2**31,), 2) == (0b010, 31)
    assert family_key((0,), (0,), 2) == (0b110, 0)


def test_a_size_without_a_plan_is_tried_again_and_a_split_is_refused_for_good():
    kernel = _kernel({})
    table = _table(kernel)
    table((torch.randn(9, 2),))
    assert table.learned == 0 and not table.refused  # not planned: asked again next time
    split = _launch(1, 9)
    split.split = object()
    kernel._launches[(9,)] = split
    table((torch.randn(9, 2),))
    assert table.learned == 0 and list(table.refused.values()) == ["a split reduction"]
    table((torch.randn(9, 2),))
    assert table.handed_back == 3 and table.learned == 0


@pytest.mark.parametrize("kind", ["i1", "fp32", "*i8 after"])
def test_a_parameter_it_cannot_pass_keeps_the_family_with_python(kind):
    signature = {**SIGNATURE, "xnumel": kind.removesuffix(" after")}
    table = _table(_kernel({(4,): _launch(2, 4, signature)}))
    table((torch.randn(4, 2),))
    assert table.learned == 0 and len(table.refused) == 1


def test_a_kernel_that_needs_scratch_memory_stays_with_python():
    launch = _launch(2, 4)
    launch.compiled.metadata.global_scratch_size = 64
    table = _table(_kernel({(4,): launch}))
    table((torch.randn(4, 2),))
    assert table.learned == 0 and "global_scratch_size=64" in next(iter(table.refused.values()))


def test_the_known_families_follow_the_programs_ring():
    # sizes 2**k + 1 for k = 5, 6, ...: each block count in a bucket of its own
    sizes = [2**k + 1 for k in range(5, 5 + FAMILIES + 2)]
    launches = {(n,): _launch(i + 1, n) for i, n in enumerate(sizes)}
    table = _table(_kernel(launches))
    for n in sizes:
        table((torch.empty(1, 1).expand(n, 1),))
    assert table.learned == FAMILIES + 2
    held = list(table.known[0].values())
    assert len(held) == FAMILIES and held[-1] is launches[(sizes[-1],)].compiled
    assert launches[(sizes[0],)].compiled not in held  # the oldest went first


# -- the C++ tables, built with a launch that records its grid and parameters ---------------

PROGRAM = """\
#include <cstdint>
#include "kiln_host.h"
static KilnApi api;
static KilnApi* const kiln_api = &api;
{declarations}
static uint32_t launched_grid;
static int64_t launched[2];
static int launch(void*, void*, uint32_t grid_x, uint32_t, uint32_t, uint32_t, uint32_t,
                  void** params) {{
  launched_grid = grid_x;
  for (int i = 0; i < 2; ++i) launched[i] = *static_cast<int32_t*>(params[2 + i]);
  return 0;
}}
// kernel 0 at size s0 (values s0, 2 * s0): -1 where no family is known, else the grid,
// with the parameters after the two pointers in out
extern "C" int64_t plan(int64_t s0, int64_t* out) {{
  api.cuda_launch = launch;
  const int64_t v[] = {{s0, 2 * s0}};
  const KilnFamily* f = kiln_find_family(0, v, 1, 1);
  if (f == nullptr) return -1;
  void* pointers[] = {{nullptr, nullptr}};
  kiln_launch_family(nullptr, f, pointers, 2, v);
  for (int i = 0; i < 2; ++i) out[i] = launched[i];
  return launched_grid;
}}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    folder = tmp_path_factory.mktemp("families")
    declarations = DECLARATIONS.format(
        kernels=1, key=3, pointers=2, slots=6, families=FAMILIES, int32_limit=INT32_LIMIT,
        specialized=0b111, size_functions="",
    )  # fmt: skip
    (folder / "program.cpp").write_text(PROGRAM.format(declarations=declarations))
    host = Path(kiln_cpp.__file__).parent / "host"
    library = folder / "program.so"
    subprocess.run(
        [compiler, "-std=c++17", "-shared", "-fPIC", f"-I{host}", "program.cpp", "-o", library],
        cwd=folder, check=True,
    )  # fmt: skip
    return ctypes.CDLL(str(library))


def _plan(program, s0: int) -> tuple[int, list[int]]:
    out = (ctypes.c_int64 * 2)()
    program.plan.restype = ctypes.c_int64
    grid = program.plan(ctypes.c_int64(s0), out)
    return grid, list(out)


def test_the_program_plans_every_size_of_a_learned_family(program):
    kernel = _kernel({(40,): _launch(7, 40)})
    table = _table(kernel, program)
    assert _plan(program, 40)[0] == -1  # nothing learned yet
    table((torch.randn(40, 2),))
    assert table.learned == 1
    # s0 then the null scratch pointer
    assert _plan(program, 40) == (1, [40, 0])
    assert _plan(program, 56) == (1, [56, 0])  # xnumel 112: the same family as 80
    assert _plan(program, 33)[0] == -1  # xnumel 66 is not a multiple of 16, 80 was
    # s0 = 64 is: 40's kernel, compiled for any s0, runs it
    assert _plan(program, 64) == (1, [64, 0])
    assert _plan(program, 72)[0] == -1  # xnumel 144 is in the bucket of 256
    kernel._launches[(104,)] = _launch(9, 104)
    table((torch.randn(104, 2),))
    assert _plan(program, 120) == (2, [120, 0])  # 240 points: two blocks of 128


def test_a_size_whose_block_counts_need_64_bit_indices_is_handed_back(program):
    kernel = _kernel({(2**29 + 8,): _launch(5, 2**29 + 8)})
    table = _table(kernel, program)
    table((torch.empty(1, 1).expand(2**29 + 8, 2),))
    assert table.learned == 1 and _plan(program, 2**29 + 24)[0] == (1 << 23) + 1
    # the same family (2**31 - 16 points are in the bucket of 2**31), too many points
    assert _plan(program, 2**30 - 8)[0] == -1


def test_a_compiled_kernel_runs_sizes_of_which_its_assumptions_hold():
    config = object()
    odd, even, one = (False, False, True), (False, True, True), (True, False, True)
    assert runs_at((config, False, odd), (config, False, even))  # 16 | n not assumed
    assert not runs_at((config, False, even), (config, False, odd))
    assert runs_at((config, False, odd), (config, False, one))  # n == 1 not assumed
    assert not runs_at((config, False, one), (config, False, odd))
    assert runs_at((config, False, (False, False, False)), (config, False, odd))  # 64-bit
    assert not runs_at((config, False, odd), (config, False, (False, False, False)))
    assert not runs_at((config, False, odd), (object(), False, odd))  # another configuration
    assert not runs_at((config, True, odd), (config, False, odd))  # another index width


def _reduction(x: int, r: int, variant: str = "k_persistent") -> Config:
    return Config(variant, (("XBLOCK", x), ("RBLOCK", r)))


def _sized_reduction_module() -> SimpleNamespace:
    return SimpleNamespace(
        META={
            "args": ["in_ptr0", "out_ptr0"],
            "sizes": ["s0"],
            "stored": ["out_ptr0"],
            "numels": {"xnumel": "s0", "rnumel": "s0"},
            "kind": "reduction",
        }  # fmt: skip
    )


def test_a_small_kernel_at_a_new_size_takes_a_compiled_kernel_of_larger_blocks():
    kernel = TritonKernel(_sized_reduction_module(), uuid.uuid4().hex, "k")
    odd = (False, False, True)
    kernel._compiled[(_reduction(8, 64), False, odd, odd, odd)] = object()
    # rows of 40 in blocks of 64: the compiled 8 x 64 covers 4 x 64 and 8 x 32
    assert kernel.compiled_cover(_reduction(4, 64), False, (40, 40, 40)) == _reduction(8, 64)
    assert kernel.compiled_cover(_reduction(8, 32), False, (20, 20, 20)) == _reduction(8, 64)
    # none where the blocks are smaller, the variant another, or an assumption fails
    assert kernel.compiled_cover(_reduction(8, 128), False, (90, 90, 90)) == _reduction(8, 128)
    looped = _reduction(4, 64, "k_looped")
    assert kernel.compiled_cover(looped, False, (40, 40, 40)) == looped
    assert kernel.compiled_cover(_reduction(4, 64), True, (40, 40, 40)) == _reduction(4, 64)
    kernel._compiled = {(_reduction(8, 64), False, *[(False, True, True)] * 3): object()}
    assert kernel.compiled_cover(_reduction(4, 64), False, (40, 40, 40)) == _reduction(4, 64)


def test_kernels_of_one_source_share_what_either_compiled():
    """A graph loaded again (or a second model of the same code) makes new kernel objects
    of the same sources: a new size launches what the first ones compiled."""
    source = uuid.uuid4().hex
    first = TritonKernel(_sized_reduction_module(), source, "k")
    odd = (False, False, True)
    first._compiled[(_reduction(8, 64), False, odd, odd, odd)] = object()
    again = TritonKernel(_sized_reduction_module(), source, "k")
    assert again.compiled_cover(_reduction(4, 64), False, (40, 40, 40)) == _reduction(8, 64)
    other = TritonKernel(_sized_reduction_module(), uuid.uuid4().hex, "k")
    assert other.compiled_cover(_reduction(4, 64), False, (40, 40, 40)) == _reduction(4, 64)


def _rows(x, w, b):
    h = torch.addmm(b, x, w)
    return torch.softmax(h * 2, -1) + x.sum(1, keepdim=True), x.t().contiguous()


def test_a_sized_program_finds_every_kernels_family_before_it_runs_and_compiles(
    monkeypatch, tmp_path
):
    """The C++ of a graph of symbolic sizes (rendered here without a GPU, its kernels in
    the interpreter; the GPU entry point builds and runs it): every kernel's values and
    family before the first allocation, a launch per kernel from its family."""
    import kiln_triton.native_host as native_host
    from kiln_cpp.codegen import HOST_HEADER
    from kiln_loopir.host import HostNotRendered
    from kiln_loopir.testing import compile_symbolic
    from kiln_triton.codegen import TritonCodegen

    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    sources = []

    def loaded(host, wait=False):
        sources.append(HOST_HEADER + host.source)
        raise HostNotRendered("rendered only: no GPU to load it on")

    monkeypatch.setattr(native_host, "_require_compiled_kernels", lambda: None)
    monkeypatch.setattr(native_host, "_loaded", loaded)
    inputs = [torch.randn(40, 96), torch.randn(96, 96) / 10, torch.randn(96)]
    compile_symbolic(_rows, inputs, codegen=TritonCodegen(), host_program="auto")
    (source,) = sources
    body = source.split('extern "C" int kiln_host_call')[1]
    kernels = body.count("kiln_find_family(")
    assert kernels >= 1 and body.count("kiln_launch_family(") == kernels
    assert body.index("kiln_find_family(") < body.index("empty_strided")
    (tmp_path / "host.cpp").write_text(source)
    done = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", "host.cpp"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_sizes_left_unspecialized_compile_one_kernel_for_every_size(monkeypatch):
    """The default: Triton compiles the sizes and block counts for any value, but those
    block counts whose specialization is the same at every size, and the keys of compiled
    kernels and families say only whether each fits 32 bits."""
    import kiln_triton.launcher as launcher
    import kiln_triton.sized_launches as sized_launches
    import kiln_triton.variants as variants

    def kernel(in_ptr0, out_ptr0, s0, xnumel, rnumel, rsplit, XBLOCK):
        pass

    module = SimpleNamespace(
        META={
            "sizes": ["s0"],
            "numels": {"xnumel": "s0", "rnumel": "64*s0"},
            "fixed_specialization": ["rnumel"],
        }
    )
    assert variants.unspecialized(module, kernel) == []  # KILN_TRITON_SPECIALIZE_SIZES=1
    monkeypatch.setattr(variants, "SPECIALIZE_SIZES", False)
    monkeypatch.setattr(launcher, "SPECIALIZE_SIZES", False)
    monkeypatch.setattr(sized_launches, "SPECIALIZED", 0b100)
    assert variants.unspecialized(module, kernel) == ["s0", "xnumel"]
    static = SimpleNamespace(META={"sizes": [], "numels": {"xnumel": "64"}})
    assert variants.unspecialized(static, kernel) == []  # numbers: compiled for them
    assert (
        launcher.size_specialization(1) == launcher.size_specialization(32) == (False, False, True)
    )
    assert family_key((1, 32), (32,), 4) == (0b100, 0b100, 5, 0)


@pytest.mark.parametrize(
    ("count", "fixed"),
    [("64", True), ("7", True), ("64*s0*s1 + 16*s1", True), ("s0", False),
     ("32*s0 + 8", False), ("s0/2", False), ("64*ceiling(s0/16)", False)],
)  # fmt: skip
def test_a_block_count_keeps_its_specialization_where_it_is_the_same_at_every_size(count, fixed):
    from kiln_triton.render import fixed_specialization

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    assert fixed_specialization(sympy.sympify(count, locals={"s0": s0, "s1": s1})) is fixed
