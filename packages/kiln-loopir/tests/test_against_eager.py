"""Functions compiled with the reference codegen agree with eager (the op table of
``kiln_loopir.testing.cases``, each in the first dtype it takes)."""

import pytest
import torch

from kiln_loopir.testing import check_against_eager, check_sizes
from kiln_loopir.testing.cases import CASES, SIZE_FAMILIES


def _inputs(name):
    case = CASES[name]
    return case.inputs(case.dtypes[0])


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name):
    check_against_eager(CASES[name].fn, _inputs(name))


def test_non_contiguous_inputs():
    x = torch.randn(6, 10)[:, ::2]  # strided
    y = torch.randn(5, 6).t()  # transposed
    check_against_eager(lambda a, b: torch.softmax(a + b, 1) * a, [x, y])


def test_storage_offset_input():
    base = torch.randn(40)
    x = base[3:23].view(4, 5)
    check_against_eager(lambda a: a.exp().sum(1), [x])


@pytest.mark.parametrize(
    "name", ["softmax", "layer_norm_gelu", "pointwise_chain", "cat", "sum_dims", "index"]
)
def test_dynamic_shapes_run_at_other_sizes(name):
    fn, inputs = CASES[name].fn, _inputs(name)
    check_against_eager(fn, inputs, dynamic=True)
    bigger = [
        torch.cat([x, x[:1] if x.dtype.is_floating_point else x[:1]], 0) if x.dim() else x
        for x in inputs
    ]
    if name == "index":
        bigger = [torch.randn(7, 7), inputs[1]]
    if name == "layer_norm_gelu":
        bigger = [torch.randn(9, 8), inputs[1], inputs[2]]
    check_against_eager(fn, inputs, dynamic=True, run_inputs=bigger)


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("reuse", [True, False])
def test_same_results_with_each_stage_switched_off(fusion, reuse):
    fn, inputs = CASES["layer_norm_gelu"].fn, _inputs("layer_norm_gelu")
    check_against_eager(fn, inputs, fusion=fusion, reuse_memory=reuse)


@pytest.mark.parametrize("name", sorted(SIZE_FAMILIES))
def test_one_compile_runs_at_every_size_of_a_family(name):
    family = SIZE_FAMILIES[name]
    compiled = check_sizes(family.fn, family.inputs, family.sizes)
    assert compiled.graph.size_hints, "compiled with symbolic sizes"
