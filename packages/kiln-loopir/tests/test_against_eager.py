"""Functions compiled with the reference codegen agree with eager."""

import pytest
import torch
import torch.nn.functional as F

from kiln_loopir.testing import check_against_eager


def r(*size, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(size, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(*size) > 0.5
    return torch.randint(-20, 20, size, dtype=dtype)


CASES = {
    "pointwise_chain": (lambda x: (x.sin() + 1).relu() * 2 - x.exp(), [r(4, 8)]),
    "broadcast_binary": (lambda x, y: x * y + y, [r(3, 1, 5), r(4, 1)]),
    "scalar_ops": (lambda x: (x + 2.5) / 3 - 1**x, [r(7, 3)]),
    "comparison_where": (lambda x, y: torch.where(x > y, x, y * 2), [r(5, 6), r(6)]),
    "logical": (
        lambda a, b: (a & b) | ~a ^ (a != b),
        [r(9, dtype=torch.bool), r(9, dtype=torch.bool)],
    ),
    "clamp": (lambda x: x.clamp(-0.5, 0.7) + x.clamp(min=0.1), [r(10)]),
    "casts": (lambda x: x.to(torch.float16).to(torch.float32) + x.to(torch.int32), [r(6, 5)]),
    "int_math": (
        lambda a, b: a * 3 + b // 2 - a % 5,
        [r(8, dtype=torch.int64), r(8, dtype=torch.int64)],
    ),
    "int_div_to_float": (lambda a: a / 3, [r(11, dtype=torch.int32)]),
    "half": (lambda x: (x * x).sum(-1) + x.mean(-1), [r(4, 33, dtype=torch.float16)]),
    "activations": (
        lambda x: (
            F.gelu(x)
            + F.silu(x)
            + F.relu(x)
            + F.gelu(x, approximate="tanh")
            + F.leaky_relu(x)
            + F.elu(x)
            + F.hardswish(x)
            + F.softplus(x)
            + F.hardsigmoid(x)
        ),
        [r(3, 17)],
    ),
    "sum_dims": (lambda x: (x.sum(), x.sum(0), x.sum((0, 2), keepdim=True)), [r(3, 4, 5)]),
    "prod_mean": (lambda x: (x.prod(1), x.mean(), x.mean(-1, keepdim=True)), [r(3, 5)]),
    "max_min": (lambda x: (x.amax(1), x.amin(0), x.max(), x.min(1)), [r(4, 6)]),
    "argmax": (lambda x: (x.argmax(1), x.argmin(0), x.argmax()), [r(5, 7)]),
    "any_all": (lambda x: (x.any(1), x.all(), (x > 0).any()), [r(5, 3, dtype=torch.bool)]),
    "var_mean": (lambda x: torch.var_mean(x, 1), [r(6, 13)]),
    "var_std": (lambda x: (x.var(0, correction=0), x.std(), x.var(1, keepdim=True)), [r(5, 9)]),
    "softmax": (lambda x: torch.softmax(x, -1), [r(4, 10)]),
    "softmax_dim0": (lambda x: torch.softmax(x, 0), [r(4, 10)]),
    "log_softmax": (lambda x: torch.log_softmax(x, 1), [r(3, 7, 2)]),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), [r(3, 7)]),
    "layer_norm_gelu": (
        lambda x, w, b: F.gelu(F.layer_norm(x, (8,), w, b)),
        [r(5, 8), r(8), r(8)],
    ),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [r(2, 4, 3, 3), r(4), r(4)]),
    "batch_norm_eval": (
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
        [r(3, 4, 5), r(4), r(4).abs() + 0.5, r(4), r(4)],
    ),
    "views": (
        lambda x: x.view(8, 4).permute(1, 0)[1:3].reshape(-1).unsqueeze(0).expand(3, 16) + 1,
        [r(4, 8)],
    ),
    "transpose_add": (lambda x, y: x.t() + y, [r(5, 7), r(7, 5)]),
    "select_squeeze": (lambda x: x[:, 2].unsqueeze(-1).squeeze(1) * x[1], [r(4, 4)]),
    "as_strided": (lambda x: torch.as_strided(x, (3, 3), (1, 3), 1) * 2, [r(20)]),
    "cat": (lambda x, y: torch.cat([x + 1, y * 2, x], 1), [r(3, 4), r(3, 2)]),
    "stack": (lambda x, y: torch.stack([x, y], 1).sum(0), [r(3, 4), r(3, 4)]),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=3.0), [r(3, 4)]),
    "gather": (lambda x, i: torch.gather(x, 1, i), [r(4, 8), torch.randint(0, 8, (4, 3))]),
    "embedding": (lambda w, i: F.embedding(i, w), [r(10, 3), torch.randint(0, 10, (2, 5))]),
    "index": (lambda x, i: x[i] + x[:, i].sum(), [r(6, 6), torch.randint(-6, 6, (4,))]),
    "index_two": (
        lambda x, i, j: x[i, :, j],
        [r(5, 3, 7), torch.randint(0, 5, (4, 1)), torch.randint(0, 7, (2,))],
    ),
    "index_select": (lambda x, i: x.index_select(1, i), [r(3, 5), torch.tensor([4, 0, 0, 2])]),
    "scatter_add": (
        lambda x, i, s: x.scatter_add(0, i, s),
        [r(5, 3), torch.randint(0, 5, (4, 3)), r(4, 3)],
    ),
    "index_put": (
        lambda x, i, v: x.index_put((i,), v, accumulate=True),
        [r(6, 2), torch.tensor([0, 2, 2, 5]), r(4, 2)],
    ),
    "slice_scatter": (
        lambda x, s: torch.slice_scatter(x, s, 1, 1, 7, 2),
        [r(3, 8), r(3, 3)],
    ),
    "full_arange": (lambda x: x + torch.arange(5) + torch.full((5,), 2.0), [r(5)]),
    "matmul_bias_gelu": (lambda x, w, b: F.gelu(x @ w + b), [r(4, 6), r(6, 3), r(3)]),
    "bmm_softmax": (
        lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 2, -1),
        [r(2, 3, 4), r(2, 5, 4)],
    ),
    "conv_relu": (lambda x, w: F.relu(F.conv2d(x, w, padding=1)), [r(1, 2, 5, 5), r(3, 2, 3, 3)]),
    "cumsum_fallback": (lambda x: x.cumsum(0) * 2, [r(6, 2)]),
    "odd_sizes": (lambda x: torch.softmax(x * 3, -1).sum(0), [r(1, 1, 13)]),
    "zero_dim": (lambda x, y: x * y + x.sum(), [r(), r(3)]),
    "empty": (lambda x: (x + 1, x.sum(0)), [r(0, 4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name):
    fn, inputs = CASES[name]
    check_against_eager(fn, inputs)


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
    fn, inputs = CASES[name]
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
    fn, inputs = CASES["layer_norm_gelu"]
    check_against_eager(fn, inputs, fusion=fusion, reuse_memory=reuse)
