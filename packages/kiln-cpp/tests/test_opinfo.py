"""Every lowered op checked through the C++ kernels against eager on PyTorch's OpInfo
samples (``op_db``), as given (broadcasting, 0-d tensors, odd sizes) and with
non-contiguous inputs.

The samples of one op in one dtype compile as one graph (one C++ library). The default
run takes a subset of ops; the full sweep over ``op_db`` in every dtype is marked slow.
"""

import pytest
import torch

from kiln_cpp import CppCodegen
from kiln_loopir.testing.opinfo import (
    BOOL_OPS,
    CUMULATIVE_OPS,
    DEFAULT_OPS,
    INTEGER_OPS,
    check_op,
    select_ops,
)

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db
CODEGEN = CppCodegen()
SWEEP_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool)
# half precision: pointwise, reductions and norms, computed in float in the kernels
HALF_OPS = ["add", "mul", "exp", "sigmoid", "sum", "mean", "softmax", "native_layer_norm",
            "where", "nn.functional.gelu"]  # fmt: skip


def _check(op, dtype, max_samples):
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{op.name} does not support {dtype}")
    result = check_op(op, dtype, codegen=CODEGEN, max_samples=max_samples)
    assert not result.failed, result.report()
    if not result.passed:
        reason = f": {result.unsupported[0].error}" if result.unsupported else ""
        pytest.skip(f"no sample of {op.name} in {dtype} reaches a lowering{reason}")


def _id(v):
    return v.full_name if hasattr(v, "full_name") else str(v).removeprefix("torch.")


DEFAULT = (
    [(op, torch.float32) for op in select_ops(op_db, DEFAULT_OPS)]
    + [(op, torch.bfloat16) for op in select_ops(op_db, HALF_OPS)]
    + [(op, torch.float16) for op in select_ops(op_db, HALF_OPS[:4])]
    + [(op, torch.int64) for op in select_ops(op_db, INTEGER_OPS)]
    + [(op, torch.bool) for op in select_ops(op_db, BOOL_OPS)]
)


@pytest.mark.parametrize("op, dtype", DEFAULT, ids=_id)
def test_lowered_op_matches_eager(op, dtype):
    _check(op, dtype, max_samples=2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", SWEEP_DTYPES, ids=_id)
@pytest.mark.parametrize("op", list(select_ops(op_db)), ids=_id)
def test_op_db_sweep(op, dtype):
    _check(op, dtype, max_samples=8)


@pytest.mark.parametrize("op", list(select_ops(op_db, CUMULATIVE_OPS)), ids=lambda op: op.full_name)
def test_cumulative_ops_as_scans(op):
    _check(op, torch.float32, max_samples=3)
