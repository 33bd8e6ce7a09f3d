"""kiln-loopir's op table through the C++ kernels against eager: every case in each dtype
it takes (float32, bfloat16, int64 ...), as given (odd sizes, broadcasting) and with
non-contiguous inputs.

The cases of one dtype compile together as one graph (one C++ library); a case whose
values differ there is compiled again alone before it fails.
"""

import functools

import pytest

from kiln_cpp import CppCodegen
from kiln_loopir.testing import Sample, check_samples
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
