"""Consecutive kernels start with one call: a launch group, one C++ function per run."""

import pytest
import torch
import torch.nn.functional as F

from kiln_cpp import CppCodegen
from kiln_loopir.testing import check_against_eager


def mlp(x, w1, b1, w2, b2, w3, b3):
    h = F.relu(F.linear(x, w1, b1))
    h = torch.tanh(F.linear(h, w2, b2))
    return F.linear(h, w3, b3).softmax(-1)


def mlp_inputs():
    return [torch.randn(2, 32)] + [
        t for _ in range(3) for t in (torch.randn(32, 32) / 6, torch.randn(32))
    ]


def test_a_run_of_kernels_is_one_call_and_equals_eager():
    compiled = check_against_eager(mlp, mlp_inputs(), codegen=CppCodegen(), run_inputs=mlp_inputs())
    (group,) = compiled.launch_groups
    assert [k.name for k in group.group.kernels] == [k.name for k in compiled.kernels]
    host = compiled.host_source
    assert f"{group.name}(" in host
    assert not any(f"    {k.name}(" in host for k in compiled.kernels)  # no launch of its own
    for kernel in compiled.kernels:
        assert f"{kernel.name}(" in group.source


def test_extern_calls_split_runs_and_symbolic_sizes_pass_through():
    def fn(a, b):
        x = torch.softmax(a * 2, -1).exp()  # kernels
        y = torch.mm(x, b)  # a large product stays an extern call
        return (y + 1).sigmoid().cos(), x.sum(0)

    compiled = check_against_eager(
        fn,
        [torch.randn(40, 300), torch.randn(300, 64)],
        codegen=CppCodegen(),
        dynamic=True,
        run_inputs=[torch.randn(24, 300), torch.randn(300, 64)],
    )
    host = compiled.host_source
    assert "aten_mm_default(" in host
    assert compiled.launch_groups
    for group in compiled.launch_groups:
        assert len(group.group.kernels) >= 2
        call = next(line for line in host.splitlines() if f"{group.name}(" in line)
        assert all(str(s) in call for s in group.group.size_args)


def test_an_out_of_range_index_inside_a_group_raises():
    def fn(a, j):
        return (a[j] + 1).exp().sum(-1), a.cos()

    x = torch.randn(5, 3)
    compiled = check_against_eager(fn, [x, torch.tensor([0, 1, -5])], codegen=CppCodegen())
    assert compiled.launch_groups
    with pytest.raises(IndexError, match="out of range"):
        compiled(x, torch.tensor([0, 4, 9]))
