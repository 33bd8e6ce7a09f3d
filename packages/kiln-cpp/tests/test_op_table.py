"""kiln-loopir's op table through the C++ kernels against eager: every case in each dtype
it takes (float32, bfloat16, int64 ...), as given (odd sizes, broadcasting) and with
non-contiguous inputs.

The cases of one dtype compile together as one graph (one C++ library); a case whose
values differ there is compiled again alone before it fails.
"""

import functools
import re

import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_loopir.testing import Sample, check_against_eager, check_samples
from kiln_loopir.testing.cases import CASES
from kiln_loopir.testing.opinfo import non_contiguous

DTYPES = sorted({d for case in CASES.values() for d in case.dtypes}, key=str)


@functools.cache
def _results(dtype):
    """The results of every case that takes ``dtype``, keyed by (case, layout)."""
    samples = []
    for name, case in sorted(CASES.items()):
        if dtype in case.dtypes:
            inputs = case.inputs(dtype)
            samples.append(Sample(f"{name} given", case.fn, inputs))
            strided = [non_contiguous(t) for t in inputs]
            samples.append(Sample(f"{name} non-contiguous", case.fn, strided, False))
    return {r.sample.name: r for r in check_samples(samples, codegen=CppCodegen())}


@pytest.mark.filterwarnings("ignore:var_mean.*degrees of freedom")
@pytest.mark.parametrize(
    "name, dtype",
    [(name, d) for name, case in sorted(CASES.items()) for d in case.dtypes],
    ids=lambda v: str(v).removeprefix("torch."),
)
def test_op_table_matches_eager(name, dtype):
    results = _results(dtype)
    for layout in ("given", "non-contiguous"):
        result = results[f"{name} {layout}"]
        if result.eager_error is not None:
            pytest.fail(f"eager refuses {name} in {dtype}: {result.eager_error}")
        if result.error is not None:
            raise AssertionError(f"{name} ({layout} inputs, {dtype})") from result.error


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_types_compute_in_float(dtype):
    """Values of half types are held and computed as float; memory keeps the half type."""
    x = torch.randn(7, 13).to(getattr(torch, dtype))
    compiled = check_against_eager(
        lambda a: (torch.softmax(a * 3, -1) + a.sum(-1, keepdim=True)).sigmoid(),
        [x],
        codegen=CppCodegen(),
    )
    source = "\n".join(k.source for k in compiled.kernels)
    value_types = set(re.findall(r"const (\w+) tmp\d+ =", source))
    assert value_types <= {"float", "bool", "int64_t"}, value_types
    assert ("uint16_t*" if dtype == "bfloat16" else "_Float16*") in source
