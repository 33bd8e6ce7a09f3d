"""Every lowered op checked against eager on PyTorch's OpInfo sample inputs.

Each sample runs as given (which covers broadcasting, 0-d tensors and odd sizes), and
again with every tensor input made non-contiguous (``kiln_loopir.testing.opinfo``). The
default run takes a subset of ops and samples; the full sweep over ``op_db`` is marked
slow.
"""

import pytest
import torch

from kiln_loopir.testing.opinfo import (
    BOOL_OPS,
    CUMULATIVE_OPS,
    DEFAULT_OPS,
    INTEGER_OPS,
    check_op,
    select_ops,
)

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db
DTYPES = (torch.float32, torch.int64, torch.bool)


def _check(op, dtype, max_samples):
    result = check_op(op, dtype, max_samples=max_samples)
    assert not result.failed, result.report()
    if not result.passed:
        reason = f": {result.unsupported[0].error}" if result.unsupported else ""
        pytest.skip(f"no sample of {op.name} in {dtype} reaches a lowering{reason}")


@pytest.mark.parametrize("op", list(select_ops(op_db, DEFAULT_OPS)), ids=lambda op: op.full_name)
def test_lowered_op_matches_eager(op):
    _check(op, torch.float32, max_samples=2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(select_ops(op_db)), ids=lambda op: op.full_name)
def test_op_db_sweep(op, dtype):
    _check(op, dtype, max_samples=8)


@pytest.mark.parametrize(
    "op, dtype",
    [(op, torch.int64) for op in select_ops(op_db, INTEGER_OPS)]
    + [(op, torch.bool) for op in select_ops(op_db, BOOL_OPS)],
    ids=lambda v: v.full_name if hasattr(v, "full_name") else str(v).removeprefix("torch."),
)
def test_lowered_op_matches_eager_on_integers_and_bools(op, dtype):
    _check(op, dtype, max_samples=2)


@pytest.mark.parametrize("op", list(select_ops(op_db, CUMULATIVE_OPS)), ids=lambda op: op.full_name)
def test_cumulative_ops_as_scans(op):
    _check(op, torch.float32, max_samples=3)
