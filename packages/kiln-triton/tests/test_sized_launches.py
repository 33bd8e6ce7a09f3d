"""What a sized host program's table learns from the Python program's plans (the table's
bytes, without a GPU: the launches and their compiled kernels stand in; the GPU entry
point runs the program itself, ``test_gpu.py::test_native_host_program_learns_each_new_size``)."""

import struct
from types import SimpleNamespace

import pytest
import torch

from kiln_triton.sized_launches import SIZES, SizeTable

PTX = ".visible .entry k(.param .u64 p0, .param .u64 p1, .param .u32 p2, .param .u64 p3)"


def _compiled(function: int, signature: dict):
    return SimpleNamespace(
        function=function,
        metadata=SimpleNamespace(num_warps=4, shared=128),
        src=SimpleNamespace(signature=signature),
        asm={"ptx": PTX},
        hash=f"k{function}",
    )


def _launch(function: int, grid, numel: int, signature: dict):
    return SimpleNamespace(
        split=None,
        runner=object(),
        compiled=_compiled(function, signature),
        fn=SimpleNamespace(arg_names=["in_ptr0", "out_ptr0", "s0", "xnumel", "XBLOCK"]),
        numels=(numel,),
        kwargs={"XBLOCK": 128},
        grid=grid,
    )


class Library:
    """Stands in for the program's library: keeps what ``kiln_host_learn_size`` got."""

    def __init__(self):
        self.entries = []

        def learn(entry):  # given ctypes.byref(entry)
            self.entries.append(entry._obj)

        self.kiln_host_learn_size = learn


def _table(kernel):
    record = {
        "symbols": [["s0", 0, "size", 0]],
        "kernels": [["kernel0", 2, ["s0"]]],
        "slots": 6,
    }
    return SizeTable(record, {"kernel0": kernel}, Library())


def test_a_size_is_learned_from_the_kernels_plan():
    signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "s0": "i32", "xnumel": "constexpr"}
    kernel = SimpleNamespace(name="kernel0", _launches={(40,): _launch(7, (3,), 1, signature)})
    table = _table(kernel)
    table((torch.randn(40, 8),))
    assert (table.handed_back, table.learned) == (1, 1)
    (entry,) = table.library.entries
    assert list(entry.key) == [40]
    launch = entry.launches[0]
    assert launch.function == 7 and list(launch.grid) == [3, 1, 1]
    assert (launch.block, launch.shared) == (128, 128)
    # s0 at 32 bits (xnumel was made a constant), then the PTX's scratch pointer
    assert launch.n_slots == 2 and list(launch.slots[:2]) == [40, 0]
    assert table._held[0] == [kernel._launches[(40,)].compiled]


def test_floats_and_wide_sizes_take_their_bytes():
    signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "s0": "i64", "xnumel": "fp32"}
    kernel = SimpleNamespace(name="kernel0", _launches={(5,): _launch(3, (1,), 2, signature)})
    table = _table(kernel)
    table((torch.randn(5, 2),))
    launch = table.library.entries[0].launches[0]
    assert launch.slots[0] == 5
    assert struct.pack("<q", launch.slots[1])[:4] == struct.pack("<f", 2.0)


def test_a_size_without_a_plan_is_tried_again_and_a_split_is_refused_for_good():
    signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "s0": "i32", "xnumel": "i32"}
    kernel = SimpleNamespace(name="kernel0", _launches={})
    table = _table(kernel)
    table((torch.randn(9, 2),))
    assert table.learned == 0 and not table.refused  # not planned: asked again next time
    split = _launch(1, (1,), 9, signature)
    split.split = object()
    kernel._launches[(9,)] = split
    table((torch.randn(9, 2),))
    assert table.learned == 0 and (9,) in table.refused
    table((torch.randn(9, 2),))
    assert table.handed_back == 3 and table.learned == 0


@pytest.mark.parametrize("kind", ["i1", "*i8 after"])
def test_a_parameter_it_cannot_pass_keeps_the_size_with_python(kind):
    signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "s0": "i32"}
    signature["xnumel"] = "i1" if kind == "i1" else "*i8"
    kernel = SimpleNamespace(name="kernel0", _launches={(4,): _launch(2, (1,), 4, signature)})
    table = _table(kernel)
    table((torch.randn(4, 2),))
    assert table.learned == 0 and (4,) in table.refused


def test_the_held_kernels_follow_the_programs_ring_of_sizes():
    signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "s0": "i32", "xnumel": "i32"}
    launches = {(n,): _launch(n + 1, (1,), n, signature) for n in range(1, SIZES + 3)}
    table = _table(SimpleNamespace(name="kernel0", _launches=launches))
    for n in range(1, SIZES + 3):
        table((torch.empty(n, 1),))
    assert table.learned == SIZES + 2
    # the program's slot 0 and 1 hold the last two sizes now, and so does the table
    assert table._held[0] == [launches[(SIZES + 1,)].compiled]
    assert table._held[1] == [launches[(SIZES + 2,)].compiled]


def test_a_kernel_that_needs_scratch_memory_stays_with_python():
    signature = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "s0": "i32", "xnumel": "i32"}
    launch = _launch(2, (1,), 4, signature)
    launch.compiled.metadata.global_scratch_size = 64
    table = _table(SimpleNamespace(name="kernel0", _launches={(4,): launch}))
    table((torch.randn(4, 2),))
    assert table.learned == 0 and "global_scratch_size=64" in table.refused[(4,)]
