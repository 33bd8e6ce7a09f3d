"""The per-call path: the dispatcher calls each entry's graph on the inputs its guards read,
then the rest of the transformed code (its epilogue); nothing is read twice."""

import torch
from recording import Recorder

from kiln_capture import capture


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x).relu()


class Labelled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.linear(x)
        return {"y": y, "total": y.sum(), "label": "out"}


def never_called(*args, **kwargs):
    raise AssertionError("the transformed function ran: the dispatcher should call the graph")


def bypass_transformed_function(captured) -> str:
    """Make the entry's transformed function fail if called; the dispatcher's source."""
    inner = captured._captured
    inner.entries[0].result.function = never_called
    inner.rebuild_dispatch()
    return inner.dispatch_source()


def test_a_graph_output_returned_is_the_graph_called_on_the_guarded_reads():
    model = Scaled()
    captured = capture(model, Recorder())
    x = torch.randn(2, 3)
    torch.testing.assert_close(captured(x), model(x))
    source = bypass_transformed_function(captured)
    assert "return ___graph0(" in source and ")[0]" in source
    assert "return ___graph0(x, ___r0_" in source, "inputs are the guards' reads"
    torch.testing.assert_close(captured(x), model(x))


def test_other_returns_run_the_epilogue_on_the_graph_outputs():
    model = Labelled()
    backend = Recorder()
    captured = capture(model, backend)
    x = torch.randn(2, 3)
    captured(x)
    source = bypass_transformed_function(captured)
    assert "return ___epilogue0(___graph0(" in source
    got, expected = captured(x), model(x)
    assert got.keys() == expected.keys() and got["label"] == "out"
    torch.testing.assert_close(got["y"], expected["y"])
    torch.testing.assert_close(got["total"], expected["total"])
    # a parameter replaced by another tensor of the same kind: the guards pass and read it
    with torch.no_grad():
        model.linear.weight = torch.nn.Parameter(torch.randn(3, 3))
    torch.testing.assert_close(captured(x)["y"], model(x)["y"])
    assert len(backend.graphs) == 1


def test_the_epilogue_replays_side_effects():
    seen = []

    def fn(x, log):
        y = x * 2
        log.append(y)
        return y + 1, len(log)

    captured = capture(fn, Recorder())
    x = torch.randn(3)
    for n in (1, 2):
        seen.clear()
        seen.extend([None] * (n - 1))
        out, length = captured(x, seen)
        assert length == n and len(seen) == n
        torch.testing.assert_close(seen[-1], x * 2)
        torch.testing.assert_close(out, x * 2 + 1)
    assert "___epilogue0(" in captured.dispatch_source()


class Settings:
    def __init__(self):
        self.scale = 2.0


class Layer(torch.nn.Module):
    def __init__(self, settings):
        super().__init__()
        self.settings = settings

    def forward(self, x):
        return x * self.settings.scale


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.settings = Settings()
        self.layers = torch.nn.ModuleList(Layer(self.settings) for _ in range(3))

    def forward(self, x):
        x = x + self.settings.scale
        for layer in self.layers:
            x = layer(x)
        return x


def test_an_object_read_through_several_paths_is_guarded_once():
    model = Stack()
    backend = Recorder()
    captured = capture(model, backend)
    x = torch.randn(3)
    torch.testing.assert_close(captured(x), model(x))
    source = captured._captured.dispatch_source()
    assert source.count(".scale") == 1, "the shared object's attribute is checked once"
    assert source.count(".settings is ___r0_0") == 3, "each other path checks identity"
    model.settings.scale = 3.0  # seen through every path
    torch.testing.assert_close(captured(x), model(x))
    model.layers[1].settings = Settings()  # no longer the same object
    model.layers[1].settings.scale = 5.0
    torch.testing.assert_close(captured(x), model(x))
    assert len(backend.graphs) == 3


class Remapped:
    """Reads some names under others, as Hugging Face configs do with ``attribute_map``."""

    aliases = {"width": "size"}

    def __init__(self):
        self.size = 2.0
        self.offset = 1.0

    def __getattribute__(self, key):
        aliases = super().__getattribute__("aliases")
        if key in aliases:
            key = aliases[key]
        return super().__getattribute__(key)


class Opaque(Remapped):
    def __getattribute__(self, key):
        if id(key) == 0:  # a builtin capture does not trace: the read stays whole
            return None
        return super().__getattribute__(key)


def scaled(x, settings):
    return x * settings.width + settings.offset


def test_a_custom_getattribute_is_traced_and_the_guards_read_past_it():
    backend = Recorder()
    captured = capture(scaled, backend)
    settings, x = Remapped(), torch.randn(3)
    torch.testing.assert_close(captured(x, settings), scaled(x, settings))
    source = captured.dispatch_source()
    assert "object_getattribute(settings, 'size')" in source
    assert "settings.width" not in source, "the class's __getattribute__ is not called"
    settings.size = 3.0  # the name the alias leads to
    torch.testing.assert_close(captured(x, settings), scaled(x, settings))
    Remapped.aliases["offset"] = "size"  # the class's table changes what a name reads
    try:
        torch.testing.assert_close(captured(x, settings), scaled(x, settings))
    finally:
        del Remapped.aliases["offset"]
    assert len(backend.graphs) == 3


def test_a_custom_getattribute_capture_cannot_trace_is_called_by_the_guards():
    backend = Recorder()
    captured = capture(scaled, backend)
    settings, x = Opaque(), torch.randn(3)
    torch.testing.assert_close(captured(x, settings), scaled(x, settings))
    assert "settings.width" in captured.dispatch_source()
    settings.size = 3.0
    torch.testing.assert_close(captured(x, settings), scaled(x, settings))
    assert len(backend.graphs) == 2


def every_kind_of_parameter(a, /, b, *rest, scale=2.0, **options):
    out = (a * b + sum(rest)) * scale
    return {"out": out, "options": sorted(options)}


def test_the_epilogue_takes_every_kind_of_parameter():
    captured = capture(every_kind_of_parameter, Recorder())
    a, b = torch.randn(3), torch.randn(3)
    for _ in range(2):
        got = captured(a, b, 1.0, 2.0, scale=3.0, flag=True)
        expected = every_kind_of_parameter(a, b, 1.0, 2.0, scale=3.0, flag=True)
        torch.testing.assert_close(got["out"], expected["out"])
        assert got["options"] == expected["options"] == ["flag"]
    assert "___epilogue0(___graph0(" in captured.dispatch_source()
    got = captured(a, b, 1.0, 2.0, flag=True)  # the default scale
    torch.testing.assert_close(got["out"], every_kind_of_parameter(a, b, 1.0, 2.0)["out"])


class Slotted:
    __slots__ = ("size",)

    def __init__(self):
        self.size = 2.0

    def __getattribute__(self, key):
        return super().__getattribute__(key)


def sized(x, settings):
    return x * settings.size


def test_a_custom_getattribute_on_a_class_with_slots():
    backend = Recorder()
    captured = capture(sized, backend)
    settings, x = Slotted(), torch.randn(3)
    torch.testing.assert_close(captured(x, settings), sized(x, settings))
    settings.size = 4.0
    torch.testing.assert_close(captured(x, settings), sized(x, settings))
    assert len(backend.graphs) == 2
