"""Split reductions: reductions with few outputs run as partial results from many programs,
combined in a fixed order by a second launch."""

import pytest
import torch

from kiln_loopir.testing import check_against_eager
from kiln_triton import TritonCodegen, configs

CASES = {
    "column_sum": (lambda a: a.sum(0), [(300, 40)]),
    "sum_of_everything": (lambda a: a.sum(), [(90, 70)]),
    "max_and_min_then_pointwise": (lambda a: (a.amax(0), a.amin(0) * 2), [(300, 12)]),
    "var_mean": (lambda a: torch.var_mean(a, 0), [(257, 9)]),
    "product_then_epilogue": (
        lambda a, b: (a * b).sum(0).relu() + b[0],
        [(130, 17), (130, 17)],
    ),
}


@pytest.fixture
def small_splits(monkeypatch):
    """Split at the tiny sizes the interpreter can run."""
    monkeypatch.setattr(configs, "SPLIT_MIN_RNUMEL", 64)
    monkeypatch.setattr(configs, "SPLIT_PROGRAMS", 8)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_reduction_equals_eager(name, dtype, device, small_splits):
    fn, shapes = CASES[name]
    if name == "product_then_epilogue" and dtype == torch.bfloat16:
        # eager's bfloat16 sum of 130 rounded products lands up to 0.375 from kiln's,
        # split or not (the looped variant differs by as much): past bfloat16 tolerance
        pytest.skip("bfloat16 sums of this length differ by accumulation order")
    inputs = [torch.randn(s, device=device).to(dtype) for s in shapes]
    compiled = check_against_eager(fn, inputs, codegen=TritonCodegen())
    launches = [la for k in compiled.kernels for la in k.fn._launches.values() if la]
    assert any(la.split is not None and la.split.nsplit > 1 for la in launches)
    if torch.device(device).type == "cuda":  # both launches from the native host program
        assert compiled.program.native is not None
        assert "(finish)" in compiled.native_host.source


def test_kernels_that_store_inside_the_loop_do_not_split(device, small_splits):
    x = torch.randn(8, 300, device=device)
    compiled = check_against_eager(lambda a: torch.softmax(a, 0), [x], codegen=TritonCodegen())
    meta = compiled.kernels[0].fn.meta
    assert meta["split_parts"] == 0
    assert all(not c.variant.endswith("_split") for c in configs.candidates(meta, {
        "xnumel": 8, "rnumel": 1 << 20}))  # fmt: skip
