"""Captures kept for later processes: a new capture of the same function checks the kept
guards and restores the compiled graph instead of tracing, and only where the kept guard,
the files the trace read and the backend's token all still hold."""

import importlib.util
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from kiln_capture import by_name, capture


class KeepingBackend:
    """Runs each graph as it is, counting its calls, and restores it by a token."""

    def __init__(self):
        self.graphs = []
        self.runs = 0

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        gm.meta["restore_token"] = str(len(self.graphs) - 1)
        return self.counted(gm.forward)

    def counted(self, forward):
        def run(*args):
            self.runs += 1
            return forward(*args)

        return run

    def restore(self, token):
        return self.counted(self.graphs[int(token)].forward)


class Store:
    """Kept captures in memory (a process's view of Kiln's cache folder)."""

    def __init__(self, backend):
        self.backend = backend
        self.data = {}

    def load(self, key):
        return self.data.get(key)

    def store(self, key, data):
        self.data[key] = data

    def restore(self, token, fn):
        return self.backend.restore(token)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return torch.relu(self.norm(self.linear(x))) * 2


def stats(captured):
    return getattr(captured, "_captured", captured).stats


def test_a_second_capture_restores_the_kept_one_instead_of_tracing():
    backend = KeepingBackend()
    store = Store(backend)
    model = Block().eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        first = capture(model, backend, kept=store)
        torch.testing.assert_close(first(x), model(x))
        assert len(store.data) == 1

        again = capture(model, backend, kept=store)
        y = torch.randn(4, 8)
        runs = backend.runs
        torch.testing.assert_close(again(y), model(y))
        torch.testing.assert_close(again(x), model(x))
    assert len(backend.graphs) == 1  # nothing traced again
    assert backend.runs == runs + 2  # the graph ran: no eager fallback
    assert (stats(again).compiles, stats(again).restored) == (0, 1)


def test_each_kept_entry_keeps_its_own_guard():
    backend = KeepingBackend()
    store = Store(backend)
    model = Block().eval()
    small, large = torch.randn(4, 8), torch.randn(6, 8)
    with torch.no_grad():
        capture(model, backend, kept=store)(small)
        second = capture(model, backend, kept=store)
        second(large)  # the kept entry's guard fails: traced, and kept too
        assert len(backend.graphs) == 2
        third = capture(model, backend, kept=store)
        torch.testing.assert_close(third(large), model(large))
        torch.testing.assert_close(third(small), model(small))
    assert len(backend.graphs) == 2
    assert stats(third).restored == 2


def test_grad_mode_is_part_of_the_kept_guard():
    backend = KeepingBackend()
    store = Store(backend)
    model = Block()
    x = torch.randn(4, 8)
    with torch.no_grad():
        capture(model, backend, kept=store)(x)
    again = capture(model, backend, kept=store)
    out = again(x)  # grad mode on: the inference entry does not apply
    assert out.requires_grad
    assert len(backend.graphs) == 2 and stats(again).restored == 0


def test_a_frame_with_side_effects_restores_its_epilogue():
    backend = KeepingBackend()
    store = Store(backend)

    def step(x, log):
        log.append(x.shape[0])
        return {"y": torch.sin(x) + 1, "count": len(log)}

    x = torch.randn(5, 3)
    capture(step, backend, kept=store)(x, [1])
    again = capture(step, backend, kept=store)
    log = [1]  # a list of the same contents: the trace read them, and guards them
    out = again(x, log)
    assert log == [1, 5]
    assert out["count"] == 2
    torch.testing.assert_close(out["y"], torch.sin(x) + 1)
    assert len(backend.graphs) == 1 and stats(again).restored == 1


def test_a_capture_whose_files_changed_is_traced_again(tmp_path):
    path = tmp_path / "kept_model.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch

            def helper(x):
                return torch.cos(x) * 3

            def f(x):
                return helper(x) + 1
            """
        )
    )
    spec = importlib.util.spec_from_file_location("kept_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kept_model"] = module
    try:
        spec.loader.exec_module(module)
        backend = KeepingBackend()
        store = Store(backend)
        x = torch.randn(3, 4)
        capture(module.f, backend, kept=store)(x)
        capture(module.f, backend, kept=store)(x)
        assert len(backend.graphs) == 1  # restored while the file is as it was
        path.write_text(path.read_text() + "\n# edited\n")
        again = capture(module.f, backend, kept=store)
        torch.testing.assert_close(again(x), torch.cos(x) * 3 + 1)
        assert len(backend.graphs) == 2 and stats(again).restored == 0
    finally:
        del sys.modules["kept_model"]


def test_nothing_is_kept_without_the_backend_s_token():
    store = Store(KeepingBackend())

    def plain_backend(gm, example_inputs):
        return gm.forward

    x = torch.randn(3)
    capture(lambda_free_function, plain_backend, kept=store)(x)
    assert store.data == {}


def lambda_free_function(x):
    return x * 2 + 1


# --- values written by name ------------------------------------------------------------


def test_named_objects_are_read_back_as_the_same_objects():
    import builtins
    import types

    import torch.nn.functional as F

    values = [
        torch,
        torch.nn.functional.__dict__,
        builtins.__dict__,
        torch.nn.Linear,
        F.layer_norm,
        F.max_pool2d,  # made by boolean_dispatch: found by its module attribute
        types.BuiltinFunctionType,
        torch.float16,
    ]
    for value in values:
        assert by_name.loads(by_name.dumps(value)) is value, value
    assert by_name.loads(by_name.dumps(torch.Size([2, 3]))) == torch.Size([2, 3])


def test_a_function_its_name_does_not_find_is_found_where_it_lies(tmp_path):
    import types

    module = types.ModuleType("kept_registry")
    exec(  # noqa: S102
        textwrap.dedent(
            """
            import functools

            def mask(x):
                return x

            REGISTRY = {"mask": mask}

            def mask(x):
                return x + 1

            class Interface:
                mapping = {"first": REGISTRY["mask"]}

            def wrap(f):
                @functools.wraps(f)
                def wrapper(*args):
                    return f(*args)
                return wrapper

            plain = mask
            mask = wrap(mask)
            """
        ),
        module.__dict__,
    )
    sys.modules["kept_registry"] = module
    try:
        for value in (module.REGISTRY["mask"], module.plain, module.mask):
            assert by_name.loads(by_name.dumps(value)) is value
    finally:
        del sys.modules["kept_registry"]


def test_objects_without_a_name_are_not_kept():
    class Local:
        pass

    def inner(x):
        return x

    for value in (Local(), object(), inner, torch.randn(2)):
        with pytest.raises(by_name.Unkeepable):
            by_name.dumps(value)


def test_code_with_constants_marshal_cannot_write_round_trips():
    code = compile("def f():\n    return G\n", "<test>", "exec")
    plain = [c for c in code.co_consts if hasattr(c, "co_code")][0]
    with_dict = plain.replace(co_consts=(*plain.co_consts, torch.nn.functional.__dict__))
    loaded = by_name.load_code(by_name.dump_code(with_dict))
    assert loaded.co_consts[-1] is torch.nn.functional.__dict__
    assert loaded.co_code == with_dict.co_code


SHARED = []


def test_a_container_the_code_shares_is_never_copied():
    code = compile("def f():\n    return G\n", "<test>", "exec")
    plain = [c for c in code.co_consts if hasattr(c, "co_code")][0]
    for shared in (SHARED, {"a": 1}, (1, SHARED)):
        with pytest.raises(by_name.Unkeepable):
            by_name.dump_code(plain.replace(co_consts=(*plain.co_consts, shared)))


def returns_a_global_list(x):
    SHARED.append(1)
    return torch.cos(x), SHARED


def test_a_frame_that_hands_out_a_global_list_keeps_handing_out_that_list():
    backend = KeepingBackend()
    store = Store(backend)
    x = torch.randn(3)
    capture(returns_a_global_list, backend, kept=store)(x)
    again = capture(returns_a_global_list, backend, kept=store)
    out, found = again(x)
    assert found is SHARED
    torch.testing.assert_close(out, torch.cos(x))


def _keyed(x):
    names = frozenset({"alpha", "beta", "gamma", "delta"})
    return x * 2 if "beta" in names else (lambda y: y + 1)(x)


def test_the_key_of_a_frame_is_its_code_not_the_objects_shared_in_it():
    from kiln_capture.kept_captures import frame_key

    key = frame_key(_keyed, "settings")
    held = [list(_keyed.__code__.co_consts) for _ in range(3)]  # more references to them
    assert frame_key(_keyed, "settings") == key and held
    assert frame_key(_keyed, "other settings") != key
    changed = types.FunctionType(
        _keyed.__code__.replace(co_consts=(*_keyed.__code__.co_consts, 7)), {}
    )
    assert frame_key(changed, "settings") != key


def test_the_key_of_a_frame_is_the_same_in_every_process():
    folder = str(Path(__file__).parent)
    script = (
        f"import sys; sys.path.insert(0, {folder!r}); import test_kept_captures as t; "
        "from kiln_capture.kept_captures import frame_key; print(frame_key(t._keyed, 's'))"
    )
    keys = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        for seed in ("1", "2")
    }  # fmt: skip
    assert len(keys) == 1 and next(iter(keys))
