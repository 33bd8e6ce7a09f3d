"""Memory planning: buffers are freed after their last use, reused, and overwritten in
place where that is safe; the planned peak is checked against what each plan implies."""

import torch

from kiln_loopir.lowering import matmul
from kiln_loopir.testing import check_against_eager

N = 16
NBYTES = N * N * 4


def chain(x):
    return x.sin().cos().exp().tanh()


def test_pointwise_chain_unfused_runs_in_place():
    compiled = check_against_eager(chain, [torch.randn(N, N)], fusion=False)
    plan = compiled.memory_plan
    assert len(compiled.kernels) == 4
    assert plan.naive_peak_bytes == 4 * NBYTES
    assert plan.peak_bytes == NBYTES  # each kernel overwrites the buffer it is last to read
    assert compiled.host_source.count("# in place") == 3


def test_reuse_of_freed_buffers(monkeypatch):
    monkeypatch.setattr(matmul, "INLINE_MATMUL_MAX_MNK", 0)  # the products as ATen calls

    # each transposing copy reads a matmul result at other points than it writes: no in
    # place there, but the second copy reuses the first matmul's buffer, freed after the
    # first copy (a pooled buffer counts as held until it is reused)
    def fn(x, w):
        y = torch.mm(x, w).t().contiguous()
        return torch.mm(y, w).t().contiguous()

    compiled = check_against_eager(fn, [torch.randn(N, N), torch.randn(N, N)], fusion=False)
    plan = compiled.memory_plan
    assert len(compiled.kernels) == 2
    assert plan.naive_peak_bytes == 4 * NBYTES
    assert plan.peak_bytes == 3 * NBYTES
    assert "# reuse" in compiled.host_source


def test_without_planning_every_buffer_stays():
    compiled = check_against_eager(chain, [torch.randn(N, N)], fusion=False, reuse_memory=False)
    assert "# in place" not in compiled.host_source
    # buffers are still freed after their last use, so the live set is at most two
    assert compiled.memory_plan.peak_bytes == 2 * NBYTES
    assert compiled.host_source.count("del buf") == 3


def test_extern_chain_frees_dead_results():
    def fn(x, w):
        return torch.mm(torch.mm(torch.mm(x, w), w), w)

    # w scaled so the chain stays near 1: the test is about buffers, not rounding
    compiled = check_against_eager(fn, [torch.randn(N, N), torch.randn(N, N) / N**0.5])
    plan = compiled.memory_plan
    assert plan.naive_peak_bytes == 3 * NBYTES
    assert plan.peak_bytes == 2 * NBYTES  # an input and a result of each matmul


def test_outputs_and_inputs_are_never_overwritten():
    x = torch.randn(N, N)
    before = x.clone()

    def fn(x):
        y = x.sin()
        return y, y.cos()

    compiled = check_against_eager(fn, [x], fusion=False)
    y, z = compiled(x)
    torch.testing.assert_close(x, before)
    assert y.data_ptr() != z.data_ptr()
    torch.testing.assert_close(z, y.cos())


def test_fused_graph_needs_only_its_outputs():
    compiled = check_against_eager(chain, [torch.randn(N, N)])
    assert len(compiled.kernels) == 1
    assert compiled.memory_plan.peak_bytes == NBYTES


def test_allocations_follow_the_store_order():
    # the plan (and the host program) is the same in every process, whatever the strings'
    # hash seed: a kernel's buffers are allocated in the order it stores them
    def fn(x):
        return x.sin(), x.cos(), x.exp(), x.tanh()

    compiled = check_against_eager(fn, [torch.randn(N, N)])
    (kernel,) = compiled.schedule.kernels()
    (step_plan,) = compiled.memory_plan.steps
    assert len(kernel.stored_buffers()) == 4
    assert step_plan.allocate == kernel.stored_buffers()
