"""A copy plan copies every pair: a few large tensors alone and the rest in one multi-tensor
copy; many large tensors all in one."""

import torch

from kiln_cudagraphs import copies
from kiln_cudagraphs.copies import ALONE_BYTES, MAX_ALONE, CopyPlan


def copy_all(targets, sources):
    """Each pair copied by a plan made for the targets' sizes, as a graph makes one."""
    CopyPlan([t.numel() * t.element_size() for t in targets])(targets, sources)


def test_every_pair_is_copied_large_ones_alone(monkeypatch):
    large = ALONE_BYTES // 4 + 7  # float32 elements past the threshold
    sources = [torch.randn(large), torch.randn(3, 5), torch.randn(17).to(torch.bfloat16)]
    sources.append(torch.randn(large // 2, 2).t())  # large and strided
    targets = [torch.empty_like(s) for s in sources]
    together: list[int] = []
    real = torch._foreach_copy_

    def counting(ts, ss):
        together.append(len(ts))
        return real(ts, ss)

    monkeypatch.setattr(copies.torch, "_foreach_copy_", counting)
    copy_all(targets, sources)
    for target, source in zip(targets, sources, strict=True):
        assert torch.equal(target, source)
    assert together == [2]  # the two small ones, in one call


def test_nothing_small_makes_no_multi_tensor_call(monkeypatch):
    monkeypatch.setattr(copies.torch, "_foreach_copy_", None)
    source = torch.randn(ALONE_BYTES)
    target = torch.empty_like(source)
    copy_all([target], [source])
    assert torch.equal(target, source)


def test_many_large_tensors_go_together(monkeypatch):
    together: list[int] = []
    real = torch._foreach_copy_
    monkeypatch.setattr(
        copies.torch, "_foreach_copy_", lambda ts, ss: (together.append(len(ts)), real(ts, ss))
    )
    sources = [torch.randn(ALONE_BYTES // 4) for _ in range(MAX_ALONE + 1)] + [torch.randn(3)]
    targets = [torch.empty_like(s) for s in sources]
    copy_all(targets, sources)
    assert all(torch.equal(t, s) for t, s in zip(targets, sources, strict=True))
    assert together == [MAX_ALONE + 2]


def test_a_plan_decides_once_from_the_sizes():
    plan = copies.CopyPlan([ALONE_BYTES, 12, ALONE_BYTES + 4])
    assert (plan.alone, plan.together) == ([0, 2], [1])
    many = copies.CopyPlan([ALONE_BYTES] * (MAX_ALONE + 1) + [12])
    assert (many.alone, many.together) == ([], list(range(MAX_ALONE + 2)))
    sources = [torch.randn(ALONE_BYTES // 4), torch.randn(3), torch.randn(ALONE_BYTES // 4 + 1)]
    targets = [torch.empty_like(s) for s in sources]
    plan(targets, sources)
    assert all(torch.equal(t, s) for t, s in zip(targets, sources, strict=True))
