"""Random numbers from a seed and an offset: statistics, repeatability, dropout."""

import torch
import torch.nn.functional as F

from kiln_loopir.testing import compile_fn


def test_rand_is_uniform_and_repeatable_under_manual_seed():
    x = torch.randn(64, 64)
    compiled = compile_fn(lambda x: torch.rand_like(x) + x * 0, [x])
    torch.manual_seed(0)
    (a,) = compiled(x)
    torch.manual_seed(0)
    (b,) = compiled(x)
    (c,) = compiled(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.min() >= 0 and a.max() < 1
    assert abs(a.mean().item() - 0.5) < 0.02
    assert abs(a.var().item() - 1 / 12) < 0.01


def test_randn_is_standard_normal():
    x = torch.randn(128, 64)
    (a,) = compile_fn(lambda x: torch.randn_like(x), [x])(x)
    assert abs(a.mean().item()) < 0.05
    assert abs(a.std().item() - 1) < 0.05


def test_two_random_ops_draw_different_streams():
    x = torch.randn(32, 32)
    a, b = compile_fn(lambda x: (torch.rand_like(x), torch.rand_like(x)), [x])(x)
    assert not torch.equal(a, b)


def test_dropout_keeps_and_scales():
    x = torch.randn(100, 100)
    compiled = compile_fn(lambda x: F.dropout(x, 0.25, training=True), [x])
    (y,) = compiled(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.02
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
