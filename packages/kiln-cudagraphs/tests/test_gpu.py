"""On a CUDA device: graphs recorded and replayed against eager (run through the GPU entry
point, integration/gpu.py).

Graphs come from kiln-loopir with Triton kernels where those packages are installed (they
are not kiln-cudagraphs' dependencies: imported with importorskip), else from plain torch
functions; the wrapper treats both alike.
"""

import copy
import importlib
import logging
from importlib import metadata

import pytest
import torch

import kiln_cudagraphs
from kiln_cudagraphs import CudaGraphRunner
from kiln_cudagraphs.graph import RecordedGraph

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TOL = {"rtol": 1e-4, "atol": 1e-4}


def block(x, w, b):
    h = torch.nn.functional.gelu(x @ w + b)
    return (h * torch.sigmoid(h), h.sum(dim=-1))


def compiled_graph(fn, inputs):
    """``fn`` compiled by kiln-loopir with Triton kernels, or ``fn`` itself without them."""
    try:
        testing = importlib.import_module("kiln_loopir.testing")
        triton_codegen = importlib.import_module("kiln_triton").TritonCodegen()
    except ImportError:
        return fn
    return testing.compile_fn(fn, inputs, codegen=triton_codegen)


def cuda_inputs(rows=16, features=32):
    x = torch.randn(rows, features, device="cuda")
    w = torch.randn(features, features, device="cuda") / features**0.5
    b = torch.randn(features, device="cuda")
    return x, w, b


def the_graph(runner: CudaGraphRunner) -> RecordedGraph:
    (graph,) = [e for e in runner.entries.values() if isinstance(e, RecordedGraph)]
    return graph


def test_replays_equal_eager_on_fresh_inputs_and_stale_outputs_raise():
    x, w, b = cuda_inputs()
    wrapped = kiln_cudagraphs.wrap(
        compiled_graph(block, [x, w, b]), [x, w, b], static_inputs={1, 2}
    )
    xs = [torch.randn_like(x) for _ in range(5)]
    kept = []
    for xi in xs:
        out, rowsum = wrapped(xi, w, b)
        expected, expected_rowsum = block(xi, w, b)
        torch.testing.assert_close(out, expected, **TOL)
        torch.testing.assert_close(rowsum, expected_rowsum, **TOL)
        kept.append((out, out.clone()))
    s = kiln_cudagraphs.stats(wrapped)
    assert (s.warmups, s.captures, s.replays, s.eager_calls) == (1, 1, 3, 0), s
    graph = the_graph(wrapped)
    assert kept[4][0].data_ptr() in graph.outputs.output_pointers()  # not a copy
    with pytest.raises(RuntimeError, match="overwritten.*Clone it"):
        kept[3][0].sum()  # the replay of xs[4] wrote over it
    assert not torch.equal(kept[3][1], kept[4][1])  # clones kept their values


def test_parameter_is_read_in_place():
    x, w, b = cuda_inputs()
    wrapped = kiln_cudagraphs.wrap(
        compiled_graph(block, [x, w, b]), [x, w, b], static_inputs={1, 2}
    )
    for _ in range(3):
        wrapped(torch.randn_like(x), w, b)
    graph = the_graph(wrapped)
    assert set(graph.in_place) == {1, 2} and graph.copied == {0}
    with torch.no_grad():
        w.mul_(-0.5)  # an optimizer step: same memory, new values
    xi = torch.randn_like(x)
    torch.testing.assert_close(wrapped(xi, w, b)[0], block(xi, w, b)[0], **TOL)
    w2 = torch.randn_like(w)  # a parameter replaced: recorded again, read at its new place
    torch.testing.assert_close(wrapped(xi, w2, b)[0], block(xi, w2, b)[0], **TOL)
    assert the_graph(wrapped).copied == {0}
    assert the_graph(wrapped).in_place[1] == w2.data_ptr()


def test_each_shape_has_its_graph():
    wrapped = kiln_cudagraphs.wrap(block, [])
    _, w, b = cuda_inputs()
    xs = [torch.randn(rows, 32, device="cuda") for rows in (4, 8, 4, 8, 4, 8, 8)]
    for x in xs:
        torch.testing.assert_close(wrapped(x, w, b)[0], block(x, w, b)[0], **TOL)
    s = kiln_cudagraphs.stats(wrapped)
    assert wrapped.num_graphs == 2 and s.captures == 2 and s.replays == 3


def test_cpu_sync_falls_back_and_later_graphs_still_record(caplog):
    def normalised(x):
        return (x / x.abs().max().item(),)  # .item() waits for the GPU: not capturable

    wrapped = kiln_cudagraphs.wrap(normalised, [])
    with caplog.at_level(logging.WARNING, "kiln.cudagraphs"):
        for _ in range(4):
            x = torch.randn(64, device="cuda")
            torch.testing.assert_close(wrapped(x)[0], normalised(x)[0])
    s = kiln_cudagraphs.stats(wrapped)
    assert s.captures == 0 and s.failed_captures == 1 and s.eager_calls == 2
    assert "the graph synchronizes with the host (called a synchronizing" in caplog.text
    assert "capture failed" not in caplog.text  # seen in the eager run: never captured
    assert_cuda_still_records()


def assert_cuda_still_records():
    """Random numbers on the device, and a new graph recorded and replayed."""
    x, w, b = cuda_inputs()
    other = kiln_cudagraphs.wrap(block, [])
    for xi in [torch.randn_like(x) for _ in range(3)]:
        torch.testing.assert_close(other(xi, w, b)[0], block(xi, w, b)[0], **TOL)
    assert kiln_cudagraphs.stats(other).replays == 1


def test_failed_capture_leaves_random_numbers_and_graphs_working():
    def waits(x):  # a sync torch's debug mode does not report: the capture itself fails
        torch.cuda.synchronize()
        return (x * 2,)

    wrapped = kiln_cudagraphs.wrap(waits, [])
    xs = [torch.randn(64, device="cuda") for _ in range(4)]
    for x in xs:
        torch.testing.assert_close(wrapped(x)[0], x * 2)
    s = kiln_cudagraphs.stats(wrapped)
    assert s.captures == 0 and s.failed_captures == 1 and s.eager_calls == 2, s
    assert_cuda_still_records()


def test_host_random_numbers_fall_back():
    def noisy(x):  # drawn on the host, copied to the GPU: a graph would freeze them
        return (x + torch.randn(x.shape).to(x.device),)

    wrapped = kiln_cudagraphs.wrap(noisy, [])
    x = torch.randn(256, device="cuda")
    outs = [wrapped(x)[0] for _ in range(5)]
    s = kiln_cudagraphs.stats(wrapped)
    assert s.captures == 0 and s.failed_captures == 1, s
    assert not torch.equal(outs[3], outs[4])
    assert_cuda_still_records()


def test_kiln_dropout_graph_replays_a_fresh_mask_at_every_call():
    testing = pytest.importorskip("kiln_loopir.testing")
    kiln_triton = pytest.importorskip("kiln_triton")

    def dropout(x):
        return (torch.nn.functional.dropout(x, 0.5, training=True),)

    x = torch.randn(4096, device="cuda") + 3.0  # no zeros of its own
    compiled = testing.compile_fn(dropout, [x], codegen=kiln_triton.TritonCodegen())
    assert "aten_randint_low(" in compiled.host_source  # the seed drawn on the device
    wrapped = kiln_cudagraphs.wrap(compiled, [x])
    outs = [wrapped(x)[0].clone() for _ in range(5)]
    s = kiln_cudagraphs.stats(wrapped)
    assert (s.warmups, s.captures, s.replays, s.eager_calls) == (1, 1, 3, 0), s
    for out in outs:
        kept = out != 0
        torch.testing.assert_close(out[kept], 2 * x[kept])
        assert 0.4 < kept.float().mean().item() < 0.6
    assert not torch.equal(outs[2], outs[3])  # a fresh mask at every call


@pytest.fixture
def kiln_with_plugins(tmp_path, monkeypatch):
    """kiln, finding kiln-triton and this runtime through entry points: those a source
    checkout on PYTHONPATH lacks are registered for the test."""
    kiln = pytest.importorskip("kiln")
    pytest.importorskip("kiln_triton")
    wanted = {
        "kiln.codegen": ("triton", "kiln_triton:triton_codegen"),
        "kiln.runtime": ("cudagraphs", "kiln_cudagraphs"),
    }
    missing = [
        f"[{group}]\n{name} = {target}\n"
        for group, (name, target) in wanted.items()
        if not any(ep.name == name for ep in metadata.entry_points(group=group))
    ]
    if missing:
        dist = tmp_path / "kiln_gpu_test_plugins-0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: kiln-gpu-test-plugins\nVersion: 0\n"
        )
        (dist / "entry_points.txt").write_text("\n".join(missing))
        monkeypatch.syspath_prepend(str(tmp_path))
    plugins = importlib.import_module("kiln._plugins")
    plugins.load_plugins.cache_clear()
    yield kiln
    plugins.load_plugins.cache_clear()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    ).cuda()


def test_kiln_compile_reduce_overhead_inference(kiln_with_plugins):
    kiln = kiln_with_plugins
    model = mlp().eval()
    compiled = kiln.compile(model, mode="reduce-overhead", options={"cache": False})
    before = kiln_cudagraphs.stats()
    xs = [torch.randn(16, 32, device="cuda") for _ in range(5)]
    with torch.no_grad():
        for x in xs:
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    after = kiln_cudagraphs.stats()
    assert after.captures - before.captures >= 1, after
    assert after.replays - before.replays >= 3, after


def test_kiln_compile_reduce_overhead_training(kiln_with_plugins):
    kiln = kiln_with_plugins
    model = mlp()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, mode="reduce-overhead", options={"cache": False})
    before = kiln_cudagraphs.stats()
    for x in [torch.randn(16, 32, device="cuda") for _ in range(4)]:
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=name)
    after = kiln_cudagraphs.stats()
    assert after.replays - before.replays >= 2, after  # forward and backward graphs


def encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), layer).cuda()


def test_kiln_compile_reduce_overhead_training_step_replays_forward_and_backward(
    kiln_with_plugins,
):
    kiln = kiln_with_plugins
    model = encoder()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, mode="reduce-overhead", options={"cache": False})
    before = kiln_cudagraphs.stats()
    for _ in range(5):
        x = torch.randn(4, 12, 16, device="cuda")
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        loss = compiled(x).square().mean()
        loss.backward()
        expected = reference(x).square().mean()
        expected.backward()
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
    after = kiln_cudagraphs.stats()
    assert after.failed_captures == before.failed_captures, after.reasons
    assert after.eager_calls == before.eager_calls, after.reasons
    assert after.replays - before.replays >= 6, after  # forward and backward, 3 steps


def test_kiln_compile_output_overwritten_by_the_next_call_raises(kiln_with_plugins):
    kiln = kiln_with_plugins
    model = mlp().eval()
    compiled = kiln.compile(model, mode="reduce-overhead", options={"cache": False})
    with torch.no_grad():
        outs = [compiled(torch.randn(16, 32, device="cuda")) for _ in range(4)]
        assert kiln_cudagraphs.stats().replays > 0
        with pytest.raises(RuntimeError, match="overwritten"):
            outs[2].sum()
        outs[3].sum()  # the latest output is valid


def test_kiln_compile_default_mode_replays_big_graphs_with_outputs_of_their_own(
    kiln_with_plugins,
):
    kiln = kiln_with_plugins
    model = encoder()  # left in training mode (no dropout): eval takes torch's fast path
    compiled = kiln.compile(model, options={"cache": False})
    before = kiln_cudagraphs.stats()
    xs = [torch.randn(4, 12, 16, device="cuda") for _ in range(5)]
    with torch.no_grad():
        outs = [compiled(x) for x in xs]  # every output kept: none is overwritten
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    after = kiln_cudagraphs.stats()
    assert after.captures - before.captures == 1, after.reasons
    assert after.replays - before.replays == 3, after
    assert len({out.data_ptr() for out in outs}) == len(outs)


def test_kiln_compile_default_mode_training_step_equals_eager(kiln_with_plugins):
    kiln = kiln_with_plugins
    model = encoder()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cache": False})
    before = kiln_cudagraphs.stats()
    for _ in range(4):
        x = torch.randn(4, 12, 16, device="cuda")
        kept = compiled(x)  # two forwards before one backward: each keeps its own results
        loss = (compiled(x * 2).square().mean() + kept.mean()) / 2
        loss.backward()
        expected = (reference(x * 2).square().mean() + reference(x).mean()) / 2
        expected.backward()
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
    after = kiln_cudagraphs.stats()
    assert after.replays - before.replays >= 4, after  # forward and backward graphs replay


def test_kiln_compile_default_mode_training_loop_replays_both_graphs(kiln_with_plugins):
    """A plain loop (forward, backward, next step): the forward's saved tensors are handed
    out over graph memory and dead by the next forward, so every call replays."""
    kiln = kiln_with_plugins
    model = encoder()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"cache": False})
    for step in range(6):
        if step == 3:
            before = kiln_cudagraphs.stats()
        x = torch.randn(4, 12, 16, device="cuda")
        loss = compiled(x).square().mean()
        loss.backward()
        expected = reference(x).square().mean()
        expected.backward()
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
    after = kiln_cudagraphs.stats()
    assert after.replays - before.replays == 6, after  # forward and backward, 3 steps
    assert after.eager_calls == before.eager_calls, after
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_kiln_compile_default_mode_launches_small_graphs_directly(kiln_with_plugins):
    kiln = kiln_with_plugins
    model = mlp().eval()
    compiled = kiln.compile(model, options={"cache": False})
    before = kiln_cudagraphs.stats()
    with torch.no_grad():
        for x in [torch.randn(16, 32, device="cuda") for _ in range(4)]:
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    after = kiln_cudagraphs.stats()
    assert (after.warmups, after.replays) == (before.warmups, before.replays), after


def test_a_call_on_another_stream_replays_after_the_last_streams_work():
    x, w, b = cuda_inputs()
    runner = CudaGraphRunner(block, static_inputs={1, 2}, fresh_outputs=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up and record on a side stream
        for _ in range(3):
            runner(x, w, b)
    before = runner.stats.replays
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the side stream's replay waits behind this
        slow = runner(x, w, b)[0]
    x2 = torch.randn_like(x)  # on the first stream again: its input copy and replay wait
    # for the side stream, else x2 would reach the side stream's replay first
    out, total = runner(x2, w, b)
    want, want_total = block(x2, w, b)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(total, want_total, **TOL)
    torch.cuda.synchronize()
    torch.testing.assert_close(slow, block(x, w, b)[0], **TOL)
    assert runner.stats.replays == before + 2
    assert runner.stats.eager_calls == 0


def test_a_call_inside_the_callers_own_capture_runs_the_compiled_callable():
    x, w, b = cuda_inputs()
    runner = CudaGraphRunner(block, static_inputs={1, 2}, fresh_outputs=True)
    runner(x, w, b)  # warmed up: the next call would record
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):  # a serving framework capturing the model itself
        out, total = runner(x, w, b)
    x.copy_(torch.randn_like(x))
    outer.replay()
    want, want_total = block(x, w, b)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(total, want_total, **TOL)
    assert runner.stats.captures == 0  # nothing recorded inside the caller's capture
