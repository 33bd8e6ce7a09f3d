"""A table of functions, each compiled and compared with eager on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def rand(*shape, grad=True, dtype=torch.float32):
    return lambda: torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def pointwise(x, y):
    return (x.sin() * y + x.exp() - torch.tanh(y) / 2,)


def matmul_gelu(x, w, b):
    return (F.gelu(x @ w + b),)


def layer_norm(x, w, b):
    return (F.layer_norm(x, (x.shape[-1],), w, b),)


def softmax(x):
    return (torch.softmax(x * 3, dim=-1), torch.log_softmax(x, dim=0))


def reductions(x):
    return (x.sum(0), x.mean(), x.amax(dim=1), x.var(dim=0))


def detach(x, y):
    return ((x.detach() * y).sum(), x.detach(), y * 2)


def partial_grad(x, y):
    return (x * y + y.cos(),)


def input_views(x):
    return (x.view(-1), x[1], x.t(), x)


def output_views(x):
    y = x * 2
    return (y, y.view(-1), y[0])


def intermediate_base(x):
    y = x.exp()
    return (y[0], y[1], y.sum())


def mutate_input(x, y):
    y.add_(1)
    return (x * y,)


def mutate_then_view(x, buf):
    buf.mul_(2)
    return (x + buf, buf.view(-1))


def not_differentiable(x):
    return (x * 2, x.argmax(dim=1), x > 0, x.shape[0])


def float64(x, y):
    return (torch.sigmoid(x) @ y,)


def bf16(x, y):
    return ((x * y).relu().sum(-1),)


def chunk_cat(x):
    a, b = x.chunk(2, dim=1)
    return (torch.cat([b.sigmoid(), a * b], dim=0),)


def where_clamp(x, y):
    return (torch.where(x > 0, x, y).clamp(-0.5, 0.5) * y,)


def attention(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True),)


def attention_gqa(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, enable_gqa=True),)


CASES = {
    "pointwise": (pointwise, [rand(4, 5), rand(4, 5)]),
    "matmul_gelu": (matmul_gelu, [rand(3, 6), rand(6, 5), rand(5)]),
    "layer_norm": (layer_norm, [rand(2, 3, 8), rand(8), rand(8)]),
    "softmax": (softmax, [rand(4, 7)]),
    "reductions": (reductions, [rand(5, 6)]),
    "detach": (detach, [rand(4, 3), rand(4, 3)]),
    "partial_grad": (partial_grad, [rand(4, 3), rand(4, 3, grad=False)]),
    "input_views": (input_views, [rand(3, 4)]),
    "output_views": (output_views, [rand(3, 4)]),
    "intermediate_base": (intermediate_base, [rand(3, 4)]),
    "mutate_input": (mutate_input, [rand(4), rand(4, grad=False)]),
    "mutate_then_view": (mutate_then_view, [rand(2, 3), rand(2, 3, grad=False)]),
    "not_differentiable": (not_differentiable, [rand(3, 4)]),
    "float64": (float64, [rand(3, 4, dtype=torch.float64), rand(4, 2, dtype=torch.float64)]),
    "bf16": (bf16, [rand(4, 8, dtype=torch.bfloat16), rand(4, 8, dtype=torch.bfloat16)]),
    "chunk_cat": (chunk_cat, [rand(3, 4)]),
    "where_clamp": (where_clamp, [rand(3, 4), rand(3, 4)]),
    "attention": (attention, [rand(2, 2, 6, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8)]),
    "attention_gqa": (attention_gqa, [rand(2, 4, 6, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_function_matches_eager(name, check):
    fn, makers = CASES[name]
    check(fn, lambda: [m() for m in makers])


@pytest.mark.parametrize("name", ["pointwise", "matmul_gelu", "softmax", "output_views"])
def test_function_matches_eager_with_default_partitioner(name, check):
    fn, makers = CASES[name]
    check(fn, lambda: [m() for m in makers], partitioner="default")


@pytest.mark.parametrize("name", ["pointwise", "matmul_gelu", "mutate_input", "input_views"])
def test_function_matches_eager_without_grad(name, check):
    fn, makers = CASES[name]
    with torch.no_grad():
        check(fn, lambda: [m() for m in makers])


def test_aliasing_outputs_are_views(check):
    compiled, _ = check(input_views, lambda: [rand(3, 4)()])
    x = torch.randn(3, 4)
    flat, row, t, same = compiled(x)
    assert same is x
    flat[0] = 100.0
    assert x[0, 0] == 100.0 and row.data_ptr() == x[1].data_ptr() and t[0, 0] == 100.0

    compiled, _ = check(intermediate_base, lambda: [rand(3, 4)()])
    a, b, _ = compiled(torch.randn(3, 4))
    a.add_(0)  # the views of one intermediate share its storage, as in eager
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_input_mutation_is_written_back(check):
    compiled, _ = check(mutate_input, lambda: [rand(4)(), rand(4, grad=False)()])
    y = torch.randn(4)
    before = y.clone()
    compiled(torch.randn(4), y)
    torch.testing.assert_close(y, before + 1)
