"""PyTorch's OpInfo samples (``op_db``) as :class:`~kiln_loopir.testing.Sample` s.

Each sample runs as given (which covers broadcasting, 0-d tensors and odd sizes) and
again with every tensor input made non-contiguous. Samples that cannot be traced to aten,
or whose graph has no op kiln-loopir lowers (nothing of ours to check), are left out.
The caller passes the ``OpInfo`` objects (``torch.testing._internal`` needs ``expecttest``,
so this module does not import it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from kiln_loopir.decompose import decompose
from kiln_loopir.lowering.registry import find_lowering, is_view_op
from kiln_loopir.testing import Sample, SampleResult, check_samples, trace_aten

__all__ = [
    "SKIP",
    "DEFAULT_OPS",
    "CUMULATIVE_OPS",
    "select_ops",
    "op_samples",
    "check_op",
    "OpResult",
]

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
# A subset quick enough for every test run: pointwise, reductions, norms, views, indexing,
# bucketing.
DEFAULT_OPS = [
    "abs", "add", "addcmul", "amax", "argmax", "atan2", "cat", "clamp",
    "div", "embedding", "exp", "expand", "flip", "gather", "histc",
    "index_select", "isnan", "log_softmax", "logical_and", "logsumexp",
    "masked_fill", "maximum", "mean", "mul", "native_layer_norm", "nn.functional.gelu",
    "nn.functional.pad", "nn.functional.relu", "permute", "pow", "remainder", "rsqrt",
    "scatter_add", "searchsorted", "sigmoid", "softmax", "stack", "std", "sub", "sum", "t",
    "tanh", "transpose", "var_mean", "where",
]  # fmt: skip
INTEGER_OPS = ["add", "mul", "where", "sum", "amax", "remainder", "bitwise_xor", "gather"]
BOOL_OPS = ["logical_and", "any", "all", "where", "eq", "max"]
# Scans (kiln_loopir.lowering.scans), checked where the code generator renders them.
CUMULATIVE_OPS = ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"]


def select_ops(op_db: Iterable, names: Iterable[str] | None = None) -> Iterator:
    """The ops of ``op_db`` worth checking (all, or those named), random ones left out."""
    wanted = None if names is None else set(names)
    for op in op_db:
        if op.name in SKIP or (wanted is not None and op.name not in wanted):
            continue
        yield op


def non_contiguous(t: object) -> object:
    """``t`` with the same values in a layout with gaps (every other element of a wider one)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.numel() <= 1:
        return t
    wide = torch.empty((*t.shape, 2), dtype=t.dtype)
    out = wide.select(-1, 0)
    out.copy_(t)
    return out


def _reaches_a_lowering(fn, inputs) -> bool:
    try:
        gm = trace_aten(fn, inputs)
    except Exception:  # samples that cannot be traced to aten (data-dependent control flow)
        return False
    targets = [n.target for n in decompose(gm).graph.nodes if n.op == "call_function"]
    return any(find_lowering(t) is not None or is_view_op(t) for t in targets)


def op_samples(op, dtype: torch.dtype, max_samples: int) -> list[Sample]:
    """Up to ``max_samples`` OpInfo samples of ``op`` in ``dtype``, each as given and with
    non-contiguous inputs (strides checked only for the former)."""
    out: list[Sample] = []
    for k, sample in enumerate(list(op.sample_inputs("cpu", dtype, requires_grad=False))):
        if k >= max_samples:
            break
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
        if not _reaches_a_lowering(fn, inputs):
            continue  # runs entirely as extern ops (or not at all): nothing of ours to check
        name = f"{op.full_name}[{k}]"
        out.append(Sample(name, fn, inputs))
        strided = [non_contiguous(t) for t in inputs]
        out.append(Sample(name + " non-contiguous", fn, strided, check_strides=False))
    return out


@dataclass
class OpResult:
    """The samples of one op in one dtype: those that matched eager, those unsupported (a
    ``NotImplementedError``), those that failed, and those eager itself refused."""

    op: str
    dtype: torch.dtype
    results: list[SampleResult] = field(default_factory=list)

    @property
    def passed(self) -> list[SampleResult]:
        return [r for r in self.results if r.passed]

    @property
    def unsupported(self) -> list[SampleResult]:
        return [r for r in self.results if r.unsupported]

    @property
    def failed(self) -> list[SampleResult]:
        return [r for r in self.results if r.error is not None and not r.unsupported]

    def report(self) -> str:
        lines = [f"{self.op} {self.dtype}: {len(self.failed)} of {len(self.results)} failed"]
        for r in self.failed:
            lines.append(f"  {r.sample.name}: {type(r.error).__name__}: {r.error}"[:2000])
        return "\n".join(lines)


def check_op(
    op, dtype: torch.dtype, *, codegen: object = "reference", max_samples: int = 2
) -> OpResult:
    """Check the samples of ``op`` in ``dtype`` against eager, compiled as one graph."""
    result = OpResult(op.full_name, dtype)
    if dtype not in op.supported_dtypes("cpu"):
        return result
    result.results = check_samples(op_samples(op, dtype, max_samples), codegen=codegen)
    return result
