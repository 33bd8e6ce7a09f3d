"""Every lowered op checked against eager on PyTorch's OpInfo sample inputs.

Each sample runs as given (which covers broadcasting, 0-d tensors and odd sizes), and
again with every tensor input made non-contiguous. The default run takes a subset of ops
and samples; the full sweep over ``op_db`` is marked slow.
"""

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from kiln_loopir import decompose
from kiln_loopir.lowering.registry import find_lowering, is_view_op
from kiln_loopir.testing import check_against_eager, trace_aten

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db

# Ops whose results are random, or that return something eager compares differently.
SKIP = {
    "rand_like", "randn_like", "randint_like", "bernoulli", "normal", "uniform",
    "multinomial", "cauchy", "exponential", "geometric", "log_normal",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "nn.functional.rrelu", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "empty_permuted",
}  # fmt: skip
DEFAULT_OPS = [
    "abs", "add", "addcmul", "amax", "argmax", "atan2", "cat", "clamp", "div",
    "embedding", "exp", "expand", "gather", "index_select", "isnan", "log_softmax",
    "logical_and", "logsumexp", "masked_fill", "maximum", "mean", "mul", "native_layer_norm",
    "nn.functional.gelu", "nn.functional.pad", "nn.functional.relu", "permute", "pow",
    "remainder", "rsqrt", "scatter_add", "sigmoid", "softmax", "stack", "std", "sub", "sum",
    "t", "tanh", "transpose", "var_mean", "where",
]  # fmt: skip
DTYPES = (torch.float32, torch.int64, torch.bool)


def _ops(names=None):
    for op in op_db:
        if op.name in SKIP or (names is not None and op.name not in names):
            continue
        yield op


def _non_contiguous(t):
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.numel() <= 1:
        return t
    wide = torch.empty((*t.shape, 2), dtype=t.dtype)
    out = wide.select(-1, 0)
    out.copy_(t)
    return out


def _check(op, dtype, max_samples):
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{op.name} does not support {dtype}")
    checked = 0
    unsupported: list[str] = []
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:max_samples]
    for sample in samples:
        if sample.kwargs.get("dropout_p") or sample.kwargs.get("training"):
            continue  # random (dropout) samples cannot match eager value for value
        # tensors anywhere in the arguments (cat and stack take a list) become inputs
        leaves, spec = tree_flatten(((sample.input, *sample.args), sample.kwargs))
        pos = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]
        if not pos:
            continue

        def fn(*tensors, _leaves=leaves, _pos=pos, _spec=spec):
            full = list(_leaves)
            for p, t in zip(_pos, tensors, strict=True):
                full[p] = t
            args, kwargs = tree_unflatten(full, _spec)
            return op.op(*args, **kwargs)

        inputs = [leaves[i] for i in pos]
        try:
            gm = trace_aten(fn, inputs)
        except Exception:  # ops whose sample cannot be traced to aten (data-dependent ...)
            continue
        targets = [n.target for n in decompose(gm).graph.nodes if n.op == "call_function"]
        if not any(find_lowering(t) is not None or is_view_op(t) for t in targets):
            continue  # runs entirely as extern ops: nothing of ours to check
        for variant in (inputs, [_non_contiguous(t) for t in inputs]):
            try:
                check_against_eager(fn, variant, check_strides=variant is inputs)
            except NotImplementedError as exc:  # a documented limitation, said clearly
                unsupported.append(str(exc))
                break
        else:
            checked += 1
    if not checked:
        reason = f": {unsupported[0]}" if unsupported else ""
        pytest.skip(f"no sample of {op.name} reaches a lowering{reason}")


@pytest.mark.parametrize("op", list(_ops(DEFAULT_OPS)), ids=lambda op: op.full_name)
def test_lowered_op_matches_eager(op):
    _check(op, torch.float32, max_samples=2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(_ops()), ids=lambda op: op.full_name)
def test_op_db_sweep(op, dtype):
    _check(op, dtype, max_samples=8)


INTEGER_OPS = ["add", "mul", "where", "sum", "amax", "remainder", "bitwise_xor", "gather"]
BOOL_OPS = ["logical_and", "any", "all", "where", "eq", "max"]


@pytest.mark.parametrize(
    "op, dtype",
    [(op, torch.int64) for op in _ops(INTEGER_OPS)] + [(op, torch.bool) for op in _ops(BOOL_OPS)],
    ids=lambda v: v.full_name if hasattr(v, "full_name") else str(v).removeprefix("torch."),
)
def test_lowered_op_matches_eager_on_integers_and_bools(op, dtype):
    _check(op, dtype, max_samples=2)
