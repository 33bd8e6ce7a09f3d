"""Constant folding: a one-element constant is written into the kernels that read it
(no kernel of its own), and kept as a buffer where an extern op or an output reads it."""

import torch

from kiln_loopir.lowering import matmul
from kiln_loopir.testing import check_against_eager


def masked_scores(mask, x):
    bias = torch.where(mask, 0.0, float("-inf"))  # two scalar_tensor constants
    return ((x @ x.t() + bias).softmax(-1),)


def test_constants_are_written_into_their_readers():
    mask = torch.rand(12, 12) > 0.2
    mask.fill_diagonal_(True)
    compiled = check_against_eager(masked_scores, [mask, torch.randn(12, 5)])
    assert compiled.kernels, "nothing was compiled"
    assert not any("scalar_tensor" in k.name for k in compiled.schedule.kernels())


def test_a_constant_an_extern_op_reads_stays_a_buffer(monkeypatch):
    monkeypatch.setattr(matmul, "INLINE_MATMUL_MAX_MNK", 0)  # the product as an ATen call

    def scaled(x):
        scale = torch.full((1, 1), 3.0)
        return (x @ scale.expand(1, 4), scale + 1)

    compiled = check_against_eager(scaled, [torch.randn(6, 1)])
    names = [k.name for k in compiled.schedule.kernels()]
    assert any("full" in name for name in names), names  # the extern op and the output
