"""capture(): caching, guards, recompiles, fullgraph, explain and the eager fallbacks."""

import functools
import logging
import warnings

import pytest
import torch
from recording import Recorder

import kiln_capture
from kiln_capture import Unsupported, capture


def add_mul(x, y):
    return (x + y) * 2


def test_reuses_the_capture_while_guards_hold():
    backend = Recorder()
    fn = capture(add_mul, backend)
    for _ in range(3):
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        torch.testing.assert_close(fn(x, y), add_mul(x, y))
    assert len(backend.graphs) == 1
    assert len(fn.cache_entries()) == 1


def test_graph_outputs_are_a_flat_tuple_with_fake_metadata():
    backend = Recorder()
    capture(lambda x: (x.sin(), [x.cos(), {"k": x + 1}]), backend)(torch.randn(3))
    gm = backend.graphs[0]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    assert isinstance(output.args[0], tuple) and len(output.args[0]) == 3
    for node in gm.graph.nodes:
        if node.op != "output":
            assert isinstance(node.meta["example_value"], torch.Tensor)


def test_guard_source_is_readable_python():
    fn = capture(add_mul, Recorder())
    fn(torch.randn(2, 3), torch.randn(2, 3))
    source = fn.cache_entries()[0].guard_source
    assert source.startswith("def guard(x, y):")
    assert "size=(2, 3)" in source and "float32" in source
    compile(source, "<guard>", "exec")


@pytest.mark.parametrize(
    "change",
    [
        lambda x: x.double(),
        lambda x: x.t(),  # strides
        lambda x: x.detach().requires_grad_(True),
        lambda x: torch.randn(5, 3),
    ],
    ids=["dtype", "stride", "requires_grad", "shape"],
)
def test_tensor_guards_recompile_on_change(change):
    backend = Recorder()
    fn = capture(lambda x: x * 3, backend, dynamic=False)
    x = torch.randn(3, 3)
    fn(x)
    y = change(torch.randn(3, 3))
    torch.testing.assert_close(fn(y), y * 3)
    assert len(backend.graphs) == 2
    assert fn.stats.recompile_reasons, "the failing guard is recorded"


def test_python_constant_guard_recompiles():
    backend = Recorder()
    fn = capture(lambda x, n: x * n, backend)
    x = torch.randn(3)
    torch.testing.assert_close(fn(x, 2), x * 2)
    torch.testing.assert_close(fn(x, 3), x * 3)
    assert len(backend.graphs) == 2
    assert "n == 2" in fn.stats.recompile_reasons[0]


def test_grad_mode_is_guarded():
    backend = Recorder()
    fn = capture(lambda x: x * 2, backend)
    x = torch.randn(3, requires_grad=True)
    assert fn(x).requires_grad
    with torch.no_grad():
        assert not fn(x).requires_grad
    assert len(backend.graphs) == 2


SCALE = 2.0


def uses_global(x):
    return x * SCALE


def test_globals_read_are_guarded():
    global SCALE
    fn = capture(uses_global, Recorder())
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), x * 2.0)
    SCALE = 5.0
    try:
        torch.testing.assert_close(fn(x), x * 5.0)
    finally:
        SCALE = 2.0


def test_recompile_limit_warns_once_naming_the_guard_then_runs_eagerly():
    backend = Recorder()
    fn = capture(lambda x, tag: x + ord(tag[-1]), backend, recompile_limit=2)
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tag in ("t0", "t1", "t2", "t3", "t4"):
            torch.testing.assert_close(fn(x, tag), x + ord(tag[-1]))
    assert len(backend.graphs) == 2
    limit = [w for w in caught if "recompile limit" in str(w.message)]
    assert len(limit) == 1
    assert "tag == 't1'" in str(limit[0].message)
    assert limit[0].filename == __file__  # the user's call, not the generated dispatcher


def test_an_int_that_changes_becomes_dynamic_after_one_recompile():
    backend = Recorder()
    fn = capture(lambda x, n: x * n + n, backend)
    x = torch.randn(3)
    for n in range(1, 6):
        torch.testing.assert_close(fn(x, n), x * n + n)
    assert len(backend.graphs) == 2
    placeholders = [node for node in backend.graphs[1].graph.nodes if node.op == "placeholder"]
    assert any(isinstance(node.meta["example_value"], torch.SymInt) for node in placeholders)


def branchy(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def test_graph_break_on_tensor_value_keeps_the_result():
    backend = Recorder()
    fn = capture(branchy, backend)
    for _ in range(4):
        x = torch.randn(5)
        torch.testing.assert_close(fn(x), branchy(x))
    assert len(backend.graphs) >= 2


def test_fullgraph_raises_unsupported_with_the_source_line():
    fn = capture(branchy, Recorder(), fullgraph=True)
    with pytest.raises(Unsupported) as info:
        fn(torch.randn(3))
    assert "tensor's value" in str(info.value)
    assert "if y.sum() > 0" in str(info.value)


def test_user_exceptions_surface_unchanged():
    def bad(x):
        x = x + 1
        raise KeyError("no such layer")

    with pytest.raises(KeyError) as info:
        capture(bad, Recorder())(torch.randn(2))
    assert info.value.args == ("no such layer",)


def test_shape_errors_surface_as_eager_raises_them():
    def mismatch(x, y):
        return x @ y

    x, y = torch.randn(2, 3), torch.randn(4, 5)
    with pytest.raises(RuntimeError) as eager:
        mismatch(x, y)
    with pytest.raises(RuntimeError) as captured:
        capture(mismatch, Recorder())(x, y)
    assert str(captured.value) == str(eager.value)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_shape_error_comes_alone_without_the_fake_tensor_log():
    def mismatch(x, y):
        return x @ y

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    records = Records()
    fake_log.addHandler(records)
    try:
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            capture(mismatch, Recorder())(torch.randn(2, 3), torch.randn(4, 5))
        assert not any("failed while attempting to run meta" in m for m in records.messages)
        # outside capture, fake tensors still log it
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(), pytest.raises(RuntimeError):
            torch.randn(2, 3) @ torch.randn(4, 5)
        assert any("failed while attempting to run meta" in m for m in records.messages)
    finally:
        fake_log.removeHandler(records)


def test_a_call_with_wrong_arguments_names_the_users_function():
    def mismatch(x, y):
        return x @ y

    captured = capture(mismatch, Recorder())
    captured(torch.randn(2, 3), torch.randn(3, 4))  # the generated fast path from here on
    calls = (
        ((torch.randn(2, 3),), {}),  # missing
        ((torch.randn(2, 3),) * 2, {"z": 1}),  # unknown keyword
        ((torch.randn(2, 3),) * 3, {}),  # too many: counted as the user's function counts
    )
    for args, kwargs in calls:
        with pytest.raises(TypeError) as eager:
            mismatch(*args, **kwargs)
        with pytest.raises(TypeError) as compiled:
            captured(*args, **kwargs)
        assert str(compiled.value) == str(eager.value)
        assert str(compiled.value).startswith("test_a_call_with_wrong_arguments_names")


def test_backend_errors_fall_back_to_eager_with_a_warning():
    def broken_backend(gm, example_inputs):
        raise RuntimeError("backend exploded")

    fn = capture(add_mul, broken_backend)
    x, y = torch.randn(3), torch.randn(3)
    with pytest.warns(RuntimeWarning, match="backend exploded"):
        torch.testing.assert_close(fn(x, y), add_mul(x, y))


def test_bad_arguments_get_clear_errors():
    with pytest.raises(TypeError, match="backend must be callable"):
        capture(add_mul, "not-a-backend")
    with pytest.raises(TypeError, match="Python function or an nn.Module"):
        capture(len, Recorder())


def test_module_capture_keeps_the_module_interface():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    captured = capture(model, Recorder())
    x = torch.randn(3, 4)
    torch.testing.assert_close(captured(x), model(x))
    assert captured[0] is model[0]
    assert [p.shape for p in captured.parameters()] == [p.shape for p in model.parameters()]


def test_parameters_are_graph_inputs_so_updates_are_seen():
    model = torch.nn.Linear(3, 3)
    backend = Recorder()
    captured = capture(model, backend)
    x = torch.randn(2, 3)
    captured(x)
    with torch.no_grad():
        model.weight.mul_(-1)
    torch.testing.assert_close(captured(x), model(x))
    assert len(backend.graphs) == 1


def test_explain_reports_graphs_breaks_and_guards():
    def two_parts(x):
        y = x.relu()
        print("between")
        return y * 2

    out = kiln_capture.explain(two_parts)(torch.randn(3))
    assert out.graph_count == 2
    assert out.graph_breaks and "print" in out.graph_breaks[0][0]
    assert 'print("between")' in out.graph_breaks[0][1]
    assert out.guards and out.guards[0].startswith("def guard(x)")
    text = str(out)
    assert "graph break" in text and "relu" in text


def test_dynamic_true_makes_sizes_symbolic():
    backend = Recorder()
    fn = capture(lambda x: x.sum(0) * x.shape[0], backend, dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(fn(x), x.sum(0) * n)
    assert len(backend.graphs) == 1


def test_automatic_dynamic_after_a_size_recompile():
    backend = Recorder()
    fn = capture(lambda x: (x * 2).sum(0), backend)
    for n in (3, 5, 9, 17):
        x = torch.randn(n, 4)
        torch.testing.assert_close(fn(x), (x * 2).sum(0))
    assert len(backend.graphs) == 2, "the second compile makes the changed dimension dynamic"


def test_branches_on_symbolic_sizes_are_guarded():
    backend = Recorder()

    def size_branch(x):
        if x.shape[0] > 4:
            return x * 2
        return x * 3

    fn = capture(size_branch, backend, dynamic=True)
    for n in (3, 6, 2, 8):
        x = torch.randn(n)
        torch.testing.assert_close(fn(x), size_branch(x))
    assert len(backend.graphs) == 2
    source = fn.cache_entries()[0].guard_source
    assert "x.size()[0]" in source, source


class Scale:
    factor = 2.0

    def __init__(self, bias):
        self.bias = bias

    def apply(self, x):
        return x * self.factor + self.bias


def uses_new_object(x):
    return Scale(1.0).apply(x)


def test_class_attributes_of_objects_made_during_capture_are_guarded():
    fn = capture(uses_new_object, Recorder())
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), x * 2.0 + 1.0)
    Scale.factor = 3.0
    try:
        torch.testing.assert_close(fn(x), x * 3.0 + 1.0)
    finally:
        Scale.factor = 2.0


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.other = Inner()

    def forward(self, x):
        return self.inner(x) + self.other(x)


def test_shared_reads_still_see_a_change_deep_in_the_module():
    model = Outer()
    backend = Recorder()
    captured = capture(model, backend)
    x = torch.randn(2, 3)
    torch.testing.assert_close(captured(x), model(x))
    source = captured._captured.dispatch_source()
    assert ":= self._modules['inner']" in source, "the submodule is read once per call"
    model.other.scale = 5.0
    torch.testing.assert_close(captured(x), model(x))
    assert len(backend.graphs) == 2


class Heard:
    def __init__(self):
        self.events = []

    def on_capture(self, captured, result):
        self.events.append(("capture", captured.fn.__name__))

    def on_eager(self, captured, reason):
        self.events.append(("eager", reason))


def test_observer_hears_each_capture():
    heard = Heard()
    fn = capture(add_mul, Recorder(), observer=heard)
    x = torch.randn(3)
    fn(x, x)
    fn(x, x)  # cached: nothing new to hear
    assert heard.events == [("capture", "add_mul")]


def test_observer_hears_of_a_module_method_and_partial():
    heard = Heard()
    module = torch.nn.Linear(3, 2)
    capture(module, Recorder(), observer=heard)(torch.randn(4, 3))
    capture(functools.partial(add_mul, torch.randn(3)), Recorder(), observer=heard)(torch.randn(3))
    capture(module.forward, Recorder(), observer=heard)(torch.randn(4, 3))
    assert [e[1] for e in heard.events] == ["forward", "add_mul", "forward"]


def test_capture_leaves_garbage_collection_as_it_found_it():
    import gc

    seen = []

    def backend(gm, example_inputs):
        seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
        return gm.forward

    gc.unfreeze()  # from a clean heap (some installations freeze objects at import)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    capture(add_mul, backend)(torch.randn(3), torch.randn(3))
    assert seen == [(True, True)]  # the old heap frozen, new objects still collected
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.freeze()  # the program's own freeze (before a fork) is kept: collection pauses
    try:
        frozen = gc.get_freeze_count()
        capture(add_mul, backend)(torch.randn(3), torch.randn(3))
        assert seen[-1] == (False, True)
        assert gc.isenabled() and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    gc.disable()  # a program that turned collection off keeps it off
    try:
        capture(add_mul, backend)(torch.randn(3), torch.randn(3))
        assert seen[-1][0] is False and not gc.isenabled()
    finally:
        gc.enable()


def _scaled(y):
    return y * 2  # an inlined call's own line


def test_each_node_keeps_the_users_source_line():
    def f(x):
        y = x.sin()
        return _scaled(y).cos()

    recorder = Recorder()
    capture(f, recorder)(torch.randn(4))
    (gm,) = recorder.graphs
    traces = {
        n.name: n.meta.get("stack_trace", "")
        for n in gm.graph.nodes
        if n.op == "call_method" or n.op == "call_function"
    }
    sin = next(t for name, t in traces.items() if name.startswith("sin"))
    assert f'File "{__file__}"' in sin and "in f\n" in sin and "y = x.sin()" in sin
    mul = next(t for name, t in traces.items() if name.startswith("mul"))
    # the call inlined: the caller's line first, the callee's last (innermost, as fx prints)
    assert mul.index("return _scaled(y).cos()") < mul.index("return y * 2")
    assert "# File: " in gm.print_readable(print_output=False)
