"""The runner's decisions, on CPU tensors through a recorder that replays by running the
callable again on the static inputs and writing the results into the static outputs: a
graph's contract (reads its input buffers, overwrites its outputs) without CUDA."""

import logging

import pytest
import torch

import kiln_cudagraphs
from kiln_cudagraphs import CudaGraphRunner, outputs
from kiln_cudagraphs.graph import RecordedGraph
from kiln_cudagraphs.pool import GraphPool
from kiln_cudagraphs.runner import MAX_RECORDINGS


class RerunRecorder:
    def __init__(self, pool=None):
        self.recorded = 0
        self.graph_pool = pool or GraphPool()

    def pool(self, device):
        return self.graph_pool

    def run_eagerly(self, fn, device):
        return fn(), None

    def __call__(self, fn, device):
        self.recorded += 1
        outputs = fn()

        def replay():
            for static, new in zip(outputs, fn(), strict=True):
                if isinstance(static, torch.Tensor) and static.data_ptr() != new.data_ptr():
                    static.copy_(new)

        return replay, outputs


class FailingRecorder(RerunRecorder):
    def __call__(self, fn, device):
        raise RuntimeError("operation not permitted when stream is capturing")


class SyncingRecorder(RerunRecorder):
    """Reports a host synchronisation in every eager run, as CudaGraphRecorder does for a
    callable that calls ``.item()``."""

    def __init__(self):
        super().__init__()
        self.watched = 0

    def run_eagerly(self, fn, device):
        self.watched += 1
        return fn(), "called a synchronizing CUDA operation"


class AccessErrors:
    """Stands in for torch's ``_set_storage_data_ptr_access_error_msg`` (CUDA builds only):
    notes the storages made to raise."""

    def __init__(self):
        self.storages = []

    def __call__(self, storage_impl, message):
        assert "overwritten" in message and "Clone it" in message
        self.storages.append(storage_impl)


@pytest.fixture
def access_errors(monkeypatch):
    fake = AccessErrors()
    monkeypatch.setattr(outputs, "set_access_error", fake)
    return fake


def mlp(x, w, b):
    return (torch.relu(x @ w + b), x.shape[0])


PARAMS = {1, 2}  # mlp's w and b, as kiln-autograd's metadata names them


def runner(fn=mlp, **kw):
    return CudaGraphRunner(
        fn, recorder=kw.pop("recorder", RerunRecorder()), device_type="cpu", **kw
    )


def graph_of(r: CudaGraphRunner) -> RecordedGraph:
    (graph,) = [e for e in r.entries.values() if isinstance(e, RecordedGraph)]
    return graph


def test_warm_up_then_record_then_replay_fresh_inputs():
    r = runner(static_inputs=PARAMS)
    w, b = torch.randn(8, 5), torch.randn(5)
    for _ in range(5):
        x = torch.randn(4, 8)  # dropped after the call: its memory may be reused
        out, n = r(x, w, b)
        expected, n_expected = mlp(x, w, b)
        torch.testing.assert_close(out, expected)
        assert n == n_expected == 4
    s = kiln_cudagraphs.stats(r)
    assert (s.warmups, s.captures, s.replays, s.eager_calls) == (1, 1, 3, 0)
    graph = graph_of(r)
    assert graph.copied == {0}  # the fresh input is copied, the parameters read in place
    assert graph.in_place == {1: w.data_ptr(), 2: b.data_ptr()}


def test_more_warm_ups_before_a_key_records():
    """``warmups=3``: a key's first three calls run without a graph, the fourth records;
    a key seen fewer times never records."""
    r = runner(static_inputs=PARAMS, warmups=3)
    w, b = torch.randn(8, 5), torch.randn(5)
    for rows in (2, 3, 4, 4, 4, 4, 4, 3):
        x = torch.randn(rows, 8)
        out, n = r(x, w, b)
        expected, n_expected = mlp(x, w, b)
        torch.testing.assert_close(out, expected)
        assert n == n_expected == rows
    s = kiln_cudagraphs.stats(r)
    # rows 4: three warm-ups, a capture, a replay; rows 2 and 3: warm-ups only
    assert (s.warmups, s.captures, s.replays, s.eager_calls) == (6, 1, 1, 0), s
    assert len([e for e in r.entries.values() if isinstance(e, RecordedGraph)]) == 1


def test_warm_ups_must_be_one_or_more():
    with pytest.raises(ValueError, match="warmups=0"):
        runner(warmups=0)


def test_inputs_not_named_static_are_copied_whatever_their_address():
    r = runner()
    w, b = torch.randn(8, 5), torch.randn(5)
    x = torch.randn(4, 8)
    for _ in range(3):
        r(x, w, b)
    assert graph_of(r).copied == {0, 1, 2}
    w.mul_(2)  # a copied input is read anew at every call
    torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])


def test_static_input_updated_in_place_is_read_in_place():
    r = runner(static_inputs=PARAMS)
    w, b = torch.randn(8, 5), torch.randn(5)
    x = torch.randn(4, 8)
    for _ in range(3):
        r(x, w, b)
    w.add_(1.0)  # an optimizer step
    torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    assert kiln_cudagraphs.stats(r).captures == 1


def test_kept_outputs_are_right_or_raise_once_overwritten():
    """Where torch can make stale outputs raise (CUDA builds), outputs are handed out over
    graph memory and raise once overwritten; elsewhere they are copies."""
    r = runner(static_inputs=PARAMS)
    w, b = torch.randn(8, 5), torch.randn(5)
    xs = [torch.randn(4, 8) for _ in range(4)]
    kept = [r(x, w, b)[0] for x in xs]
    stale = 0
    for x, out in zip(xs, kept, strict=True):
        try:
            torch.testing.assert_close(out, mlp(x, w, b)[0])
        except RuntimeError as error:
            assert "overwritten" in str(error)
            stale += 1
    torch.testing.assert_close(kept[-1], mlp(xs[-1], w, b)[0])
    assert stale == (0 if outputs.set_access_error is None else 2)  # the two replays before


def test_outputs_are_handed_out_over_graph_memory_and_invalidated_by_the_next_replay(
    access_errors,
):
    r = runner(static_inputs=PARAMS)
    w, b = torch.randn(8, 5), torch.randn(5)
    x = torch.randn(4, 8)
    r(x, w, b)
    first = r(x, w, b)[0]  # recorded: the checked replay's outputs
    torch.testing.assert_close(first, mlp(x, w, b)[0])
    (pointer,) = graph_of(r).outputs.output_pointers()
    assert first.data_ptr() == pointer  # no copy
    assert access_errors.storages == []
    x2 = torch.randn(4, 8)
    second = r(x2, w, b)[0]
    assert access_errors.storages == [first.untyped_storage()._cdata]
    assert second.data_ptr() == pointer
    torch.testing.assert_close(second, mlp(x2, w, b)[0])
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata


def test_a_graph_reads_another_graphs_outputs_in_place(access_errors):
    """A training step: the backward graph reads what the forward graph saved."""
    pool = GraphPool()
    forward = runner(lambda x, w: (x @ w, torch.tanh(x @ w)), static_inputs={1},
                     recorder=RerunRecorder(pool))  # fmt: skip
    backward = runner(lambda saved, g: ((1 - saved * saved) * g,), recorder=RerunRecorder(pool))
    w = torch.randn(8, 5)
    for _ in range(5):
        x, g = torch.randn(4, 8), torch.randn(4, 5)
        _, saved = forward(x, w)
        (grad,) = backward(saved, g)
        t = torch.tanh(x @ w)
        torch.testing.assert_close(grad, (1 - t * t) * g)
    bw = graph_of(backward)
    assert bw.copied == {1} and set(bw.in_place) == {0}  # the saved tensor is not copied
    assert kiln_cudagraphs.stats(backward).captures == 1
    assert kiln_cudagraphs.stats(forward).replays == 3


def test_an_output_fed_back_is_copied():
    r = runner(lambda h, w: (torch.tanh(h @ w),), static_inputs={1})
    w = torch.randn(6, 6) / 3
    h = torch.randn(2, 6)
    expected = h
    for _ in range(6):
        (h,) = r(h, w)
        expected = torch.tanh(expected @ w)
        torch.testing.assert_close(h, expected)
    assert graph_of(r).copied == {0}


def test_parameter_moved_elsewhere_records_again_reading_it_in_place():
    r = runner(static_inputs=PARAMS)
    x, b = torch.randn(4, 8), torch.randn(5)
    w = torch.randn(8, 5)
    for _ in range(3):
        r(x, w, b)
    w2 = torch.randn(8, 5)  # e.g. a parameter replaced by a new tensor
    out, _ = r(x, w2, b)
    torch.testing.assert_close(out, mlp(x, w2, b)[0])
    assert graph_of(r).copied == {0} and graph_of(r).in_place[1] == w2.data_ptr()
    torch.testing.assert_close(r(x, w2, b)[0], mlp(x, w2, b)[0])
    assert kiln_cudagraphs.stats(r).captures == 2


def test_inputs_that_keep_moving_end_in_eager_calls():
    r = runner(static_inputs=PARAMS)
    x, b = torch.randn(4, 8), torch.randn(5)
    ws = [torch.randn(8, 5) for _ in range(10)]
    for w in ws:
        torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    s = kiln_cudagraphs.stats(r)
    assert s.captures == 1 + MAX_RECORDINGS
    assert any("moved" in reason for reason in s.reasons)


def test_with_fresh_outputs_a_parameter_that_moved_ends_in_eager_calls():
    # FSDP2 allocates its unsharded parameters anew at every all-gather: in the default
    # mode the key's graph is dropped at the first move, not recorded again
    r = runner(static_inputs=PARAMS, fresh_outputs=True)
    x, b = torch.randn(4, 8), torch.randn(5)
    ws = [torch.randn(8, 5) for _ in range(4)]
    for w in [ws[0], *ws]:
        torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    s = kiln_cudagraphs.stats(r)
    assert (s.captures, s.replays, s.failed_captures, s.eager_calls) == (1, 0, 1, 2)
    assert any("input 1 (a parameter or buffer read in place) moved" in r for r in s.reasons)
    assert not r.num_graphs


def test_pinned_inputs_compute_no_key():
    r = runner(static_inputs=PARAMS, pinned=True)
    w, b = torch.randn(8, 5), torch.randn(5)
    for _ in range(4):
        x = torch.randn(4, 8)
        torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    assert list(r.entries) == [(3,)]  # keyed by the number of inputs only
    assert kiln_cudagraphs.stats(r).replays == 2


def test_keyed_inputs_alone_make_the_key():
    r = runner(static_inputs=PARAMS, keyed_inputs={0})
    w, b = torch.randn(8, 5), torch.randn(5)
    for rows in (2, 3, 2, 3, 2, 3):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    assert sorted(r.entries) == sorted(
        [(3, ("tensor", torch.Size([n, 8]), (8, 1), torch.float32, x.device)) for n in (2, 3)]
    )
    assert kiln_cudagraphs.stats(r).replays == 2


def test_each_shape_gets_its_graph_and_the_least_recently_used_is_evicted():
    r = runner(max_graphs=2, static_inputs=PARAMS)
    w, b = torch.randn(8, 5), torch.randn(5)
    # 3 evicts 2 (1 was used since), then 2 evicts 1
    for rows in (1, 1, 2, 2, 1, 3, 3, 3, 2, 2):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    assert r.num_graphs == 2
    s = kiln_cudagraphs.stats(r)
    assert (s.evictions, s.eager_calls) == (2, 0)
    assert (s.warmups, s.captures, s.replays) == (4, 4, 2)  # 2 again after its eviction


def test_a_graph_whose_saved_outputs_are_alive_is_not_evicted(caplog):
    r = runner(two_outputs, static_inputs=PARAMS, fresh_outputs=True, max_graphs=1,
               saved_outputs={1})  # fmt: skip
    w, b = torch.randn(8, 5), torch.randn(5)
    for _ in range(3):
        r(torch.randn(4, 8), w, b)
    alive = r(torch.randn(4, 8), w, b)  # its saved tensor stays alive
    x = torch.randn(2, 8)
    with caplog.at_level(logging.INFO, "kiln.cudagraphs"):
        torch.testing.assert_close(r(x, w, b)[1], two_outputs(x, w, b)[1])
    s = kiln_cudagraphs.stats(r)
    assert (s.evictions, r.num_graphs) == (0, 1)
    assert "outputs are all still in use" in caplog.text
    del alive
    r(x, w, b)
    assert kiln_cudagraphs.stats(r).evictions == 1


def test_cpu_inputs_run_the_compiled_callable(caplog):
    r = kiln_cudagraphs.wrap(mlp, [])
    w, b = torch.randn(8, 5), torch.randn(5)
    with caplog.at_level(logging.WARNING, "kiln.cudagraphs"):
        for _ in range(3):
            x = torch.randn(4, 8)
            out, n = r(x, w, b)
            assert torch.equal(out, mlp(x, w, b)[0]) and n == 4
    assert "input 0 is on cpu, and graphs are recorded on 'cuda'" in caplog.text
    s = kiln_cudagraphs.stats(r)
    assert (s.eager_calls, s.captures, s.warmups) == (3, 0, 0)


def test_inputs_requiring_grad_under_grad_mode_run_eagerly():
    r = runner()
    w = torch.randn(8, 5, requires_grad=True)
    b = torch.randn(5)
    xs = [torch.randn(4, 8) for _ in range(6)]  # kept: no two share an address
    for x in xs[:3]:
        out, _ = r(x, w, b)
    out.sum().backward()
    assert w.grad is not None
    with torch.no_grad():
        for x in xs[3:]:
            r(x, w, b)
    s = kiln_cudagraphs.stats(r)
    assert (s.eager_calls, s.captures, s.replays) == (3, 1, 1)


def test_failed_capture_runs_eagerly_and_says_why(caplog):
    r = runner(recorder=FailingRecorder())
    w, b = torch.randn(8, 5), torch.randn(5)
    with caplog.at_level(logging.WARNING, "kiln.cudagraphs"):
        for _ in range(4):
            x = torch.randn(4, 8)
            torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    assert "capture failed: RuntimeError: operation not permitted" in caplog.text
    s = kiln_cudagraphs.stats(r)
    assert (s.failed_captures, s.captures, s.eager_calls) == (1, 0, 2)


def test_host_sync_in_the_eager_run_means_no_capture_is_attempted(caplog):
    recorder = SyncingRecorder()
    r = runner(recorder=recorder)
    w, b = torch.randn(8, 5), torch.randn(5)
    xs = [torch.randn(4, 8) for _ in range(4)]
    with caplog.at_level(logging.WARNING, "kiln.cudagraphs"):
        for x in xs:
            torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    assert recorder.watched == 1 and recorder.recorded == 0
    s = kiln_cudagraphs.stats(r)
    assert (s.warmups, s.failed_captures, s.captures, s.eager_calls) == (1, 1, 0, 2)
    reason = "the graph synchronizes with the host (called a synchronizing CUDA operation)"
    assert s.reasons == {reason: 2}
    assert caplog.text.count(reason) == 1


def test_replay_that_differs_from_eager_is_dropped():
    def noisy(x):  # random numbers drawn on the host: no graph may freeze them
        return (x + torch.randn(x.shape),)

    r = runner(noisy)
    x = torch.randn(16)
    for _ in range(4):
        r(x)
    s = kiln_cudagraphs.stats(r)
    assert s.failed_captures == 1 and s.captures == 0
    assert any("the replay is not the eager result" in k for k in s.reasons)
    a, b = r(x)[0], r(x)[0]
    assert not torch.equal(a, b)  # fresh numbers at every call


class HostProgram:
    """Holds a host program's source as kiln-loopir's CompiledGraph does."""

    def __init__(self, source):
        self.host_source = source

    def __call__(self, x):
        return (x * 2,)


class WithConstants:
    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, *inputs):
        return self.compiled(*inputs)


def test_host_program_drawing_seeds_on_the_host_is_never_recorded():
    source = "def call(args):\n    seed0 = make_seed('cuda:0')\n    ...\n"
    r = runner(WithConstants(HostProgram(source)))
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(r(x)[0], x * 2)
    s = kiln_cudagraphs.stats(r)
    assert (s.eager_calls, s.warmups, s.captures) == (3, 0, 0)
    assert any("draws random seeds on the host (make_seed)" in k for k in s.reasons)
    plain = runner(WithConstants(HostProgram("def call(args):\n    return (args[0] * 2,)\n")))
    for _ in range(3):
        plain(x)
    assert kiln_cudagraphs.stats(plain).captures == 1


def test_expanded_input_that_changes_is_refused():
    def double(x):
        return (x * 2,)

    r = runner(double)
    xs = [torch.randn(1, 4).expand(3, 4) for _ in range(3)]  # kept: each at its address
    for x in xs:
        torch.testing.assert_close(r(x)[0], x * 2)
    assert any("share memory" in k for k in kiln_cudagraphs.stats(r).reasons)


def test_process_totals_add_up():
    before = kiln_cudagraphs.stats()
    r = runner()
    w, b = torch.randn(8, 5), torch.randn(5)
    for x in [torch.randn(4, 8) for _ in range(3)]:  # kept: no two share an address
        r(x, w, b)
    after = kiln_cudagraphs.stats()
    assert after.captures - before.captures == 1
    assert after.replays - before.replays == 1


def test_stats_of_something_else_is_explained():
    with pytest.raises(TypeError, match="returned by kiln_cudagraphs.wrap"):
        kiln_cudagraphs.stats(mlp)


def test_unused_inputs_are_neither_checked_copied_nor_read_in_place():
    def ignores_seed(x, seed):  # a seed no result depends on, new (elsewhere) at each call
        return (x * 2,)

    refused = runner(ignores_seed)
    refused(torch.randn(4), torch.empty((), device="meta"))
    (reason,) = kiln_cudagraphs.stats(refused).reasons
    assert "input 1 is on meta" in reason
    r = runner(ignores_seed, unused_inputs={1})
    for _ in range(4):
        x = torch.randn(4)
        torch.testing.assert_close(r(x, torch.empty((), device="meta"))[0], x * 2)
    s = kiln_cudagraphs.stats(r)
    assert (s.captures, s.replays, s.failed_captures, s.eager_calls) == (1, 2, 0, 0)
    graph = graph_of(r)
    assert 1 not in graph.copied and 1 not in graph.in_place


def test_unchecked_outputs_are_left_out_of_the_replay_check():
    counter = iter(range(1000))

    def with_state(x):  # output 1 differs at every run, as attention's rng state does
        return (x * 2, torch.tensor(next(counter)))

    strict = runner(with_state)
    x = torch.randn(4)
    for _ in range(3):
        strict(x)
    (reason,) = kiln_cudagraphs.stats(strict).reasons
    assert "output 1 (torch.int64 (), in graph memory) differs" in reason
    lenient = runner(with_state, unchecked_outputs={1})
    for _ in range(4):
        torch.testing.assert_close(lenient(x)[0], x * 2)
    s = kiln_cudagraphs.stats(lenient)
    assert (s.captures, s.replays, s.failed_captures) == (1, 2, 0)


def two_outputs(x, w, b):
    h = torch.relu(x @ w + b)
    return (h, h.sum(0) * 2)


def test_fresh_outputs_outlive_later_replays_and_never_raise(access_errors):
    r = runner(two_outputs, static_inputs=PARAMS, fresh_outputs=True)
    w, b = torch.randn(8, 5), torch.randn(5)
    xs = [torch.randn(4, 8) for _ in range(5)]
    kept = [r(x, w, b) for x in xs]
    assert kiln_cudagraphs.stats(r).replays == 3
    for x, (h, s) in zip(xs, kept, strict=True):  # every call's outputs are its own
        want_h, want_s = two_outputs(x, w, b)
        torch.testing.assert_close(h, want_h)
        torch.testing.assert_close(s, want_s)
    assert access_errors.storages == []  # nothing handed out over graph memory
    h, s = kept[-1]  # one block holds a call's outputs
    assert h.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()


def test_fresh_outputs_runner_logs_a_refusal_at_info(caplog):
    r = runner(static_inputs=PARAMS, fresh_outputs=True, recorder=FailingRecorder())
    w, b = torch.randn(8, 5), torch.randn(5)
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        for _ in range(3):
            x = torch.randn(4, 8)
            torch.testing.assert_close(r(x, w, b)[0], mlp(x, w, b)[0])
    (record,) = [r for r in caplog.records if "runs without CUDA graphs" in r.getMessage()]
    assert record.levelno == logging.INFO


def test_fresh_outputs_too_big_to_copy_run_without_a_graph():
    r = runner(two_outputs, static_inputs=PARAMS, fresh_outputs=True, max_copy_bytes=64)
    w, b = torch.randn(8, 5), torch.randn(5)  # outputs of 4x5 and 5 floats: 100 bytes
    for _ in range(4):
        x = torch.randn(4, 8)
        torch.testing.assert_close(r(x, w, b)[0], two_outputs(x, w, b)[0])
    s = kiln_cudagraphs.stats(r)
    assert (s.captures, s.replays, s.failed_captures) == (0, 0, 1)
    assert any("more than copying them at every call would save" in k for k in s.reasons)


def test_saved_outputs_are_not_copied_and_a_replay_never_overwrites_live_ones():
    """A forward graph's saved tensors (output 1 here) are handed out over graph memory; a
    second forward while the first one's are alive (its backward has not run) runs without
    a graph, and replays again once they are gone."""
    r = runner(two_outputs, static_inputs=PARAMS, fresh_outputs=True, saved_outputs={1})
    w, b = torch.randn(8, 5), torch.randn(5)
    for _ in range(3):  # warm-up, record, replay: each call's saved tensor dies at once
        x = torch.randn(4, 8)
        torch.testing.assert_close(r(x, w, b)[1], two_outputs(x, w, b)[1])
    assert kiln_cudagraphs.stats(r).replays == 1
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
    first = r(x1, w, b)
    second = r(x2, w, b)  # first[1] is alive: this call must not overwrite it
    torch.testing.assert_close(first[1], two_outputs(x1, w, b)[1])
    torch.testing.assert_close(second[1], two_outputs(x2, w, b)[1])
    s = kiln_cudagraphs.stats(r)
    assert (s.replays, s.eager_calls) == (2, 1)
    assert any("still alive" in reason for reason in s.reasons)
    assert graph_of(r).outputs.copy_bytes == 4 * 5 * 4  # output 0 alone is copied
    del first, second
    r(torch.randn(4, 8), w, b)
    assert kiln_cudagraphs.stats(r).replays == 3
