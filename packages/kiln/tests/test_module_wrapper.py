"""The module kiln.compile returns behaves like the model it wraps."""

import pytest
import torch
from helpers import Block

import kiln


@pytest.fixture
def model_and_compiled():
    torch.manual_seed(0)
    model = Block()
    return model, kiln.compile(model, backend="aot_eager")


def test_is_a_module_with_the_models_state(model_and_compiled):
    model, compiled = model_and_compiled
    assert isinstance(compiled, torch.nn.Module)
    assert isinstance(compiled, kiln.CompiledModule)
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    assert dict(compiled.named_parameters()).keys() == dict(model.named_parameters()).keys()
    assert [n for n, _ in compiled.named_modules()] == [n for n, _ in model.named_modules()]
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert "norm.weight" in compiled.state_dict()  # no prefix
    assert compiled.norm is model.norm


def test_attributes_are_read_and_written_on_the_model(model_and_compiled):
    model, compiled = model_and_compiled
    compiled.note = "set through the wrapper"
    assert model.note == "set through the wrapper"
    model.other = 3
    assert compiled.other == 3
    del compiled.note
    assert not hasattr(model, "note")
    with pytest.raises(AttributeError):
        compiled.missing_attribute  # noqa: B018


def test_train_and_eval_change_the_model_and_return_the_wrapper(model_and_compiled):
    model, compiled = model_and_compiled
    assert compiled.eval() is compiled
    assert not model.training and not compiled.training and not model.norm.training
    assert compiled.train() is compiled
    assert model.training and compiled.training
    compiled.training = False
    assert not model.training


def test_wrapping_keeps_the_models_mode():
    model = Block().eval()
    compiled = kiln.compile(model)
    assert not model.training and not compiled.training


def test_load_state_dict_reaches_the_compiled_graph(model_and_compiled):
    model, compiled = model_and_compiled
    x = torch.randn(4, 16)
    before = compiled(x)
    other = Block()
    compiled.load_state_dict(other.state_dict())
    torch.testing.assert_close(compiled(x), other(x))
    assert not torch.allclose(before, other(x))
    for key, value in other.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value)


def test_state_dict_round_trip_into_a_fresh_model(model_and_compiled):
    _, compiled = model_and_compiled
    fresh = Block()
    fresh.load_state_dict(compiled.state_dict())  # strict: the keys are the model's own
    x = torch.randn(4, 16)
    torch.testing.assert_close(fresh(x), compiled(x))


def test_optimizer_step_through_the_wrapper(model_and_compiled):
    model, compiled = model_and_compiled
    reference = Block()
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randn(4, 16)
        compiled(x).pow(2).sum().backward()
        reference(x).pow(2).sum().backward()
        opt.step()
        opt_ref.step()
        compiled.zero_grad()
        reference.zero_grad()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, msg=key)


def test_to_returns_the_wrapper(model_and_compiled):
    model, compiled = model_and_compiled
    assert compiled.to(torch.float64) is compiled
    assert model.up.weight.dtype == torch.float64
    x = torch.randn(2, 16, dtype=torch.float64)
    torch.testing.assert_close(compiled(x), model(x))


def test_forward_hooks_on_the_wrapper_run(model_and_compiled):
    _, compiled = model_and_compiled
    seen = []
    handle = compiled.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    compiled(torch.randn(3, 16))
    handle.remove()
    assert seen == [torch.Size([3, 16])]


def test_a_call_without_hooks_goes_straight_to_the_captured_forward(model_and_compiled):
    model, compiled = model_and_compiled
    x = torch.randn(3, 16)
    compiled(x)
    captured = compiled._captured._captured

    def call_counted():
        """compiled(x), and whether the captured forward's dispatcher ran (a recompile
        puts a new dispatcher in place: the count is taken on the way in)."""
        dispatch, hits = type(captured).__call__, []

        def counted(*args, **kwargs):
            hits.append(1)
            return dispatch(*args, **kwargs)

        type(captured).__call__ = counted
        try:
            return compiled(x), bool(hits)
        finally:
            if type(captured).__call__ is counted:
                type(captured).__call__ = dispatch

    out, ran = call_counted()
    torch.testing.assert_close(out, model(x))
    assert ran, "the compiled graph's dispatcher ran"
    # hooks on the model, global hooks: the model's own call runs them, around the
    # captured forward
    seen = []
    handle = model.register_forward_hook(lambda mod, args, out: seen.append("model"))
    out, ran = call_counted()
    torch.testing.assert_close(out, model(x))
    handle.remove()
    assert ran
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: seen.append("global") if mod is model else None
    )
    out, ran = call_counted()
    torch.testing.assert_close(out, model(x))
    handle.remove()
    assert ran
    assert seen == ["model", "model", "global", "global"]
    with kiln.disable():  # the model's own forward
        assert not call_counted()[1]


def test_sequential_keeps_its_protocol():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = kiln.compile(model, backend="eager")
    assert len(compiled) == 2
    assert compiled[0] is model[0]
    assert [type(m) for m in compiled] == [torch.nn.Linear, torch.nn.ReLU]
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))


class Parent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.block(x))


def test_a_compiled_submodule_is_the_model_for_its_parent():
    torch.manual_seed(0)
    parent = Parent()
    keys = list(parent.state_dict())
    inner = parent.block
    parent.block = kiln.compile(parent.block, backend="aot_eager")
    assert list(parent.state_dict()) == keys
    assert len(list(parent.parameters())) == len(keys)
    other = Parent()
    parent.load_state_dict(other.state_dict())  # strict
    x = torch.randn(3, 16)
    torch.testing.assert_close(parent(x), other(x))
    parent.to(torch.float64)
    assert inner.up.weight.dtype == torch.float64
    parent.eval()
    assert not inner.training and not inner.norm.training


def test_copies_and_pickles_are_compiled_copies_of_the_model(model_and_compiled, tmp_path):
    import copy

    model, compiled = model_and_compiled
    x = torch.randn(2, 16)
    twin = copy.deepcopy(compiled)
    assert isinstance(twin, kiln.CompiledModule) and twin._orig_mod is not model
    torch.testing.assert_close(twin(x), model(x))
    torch.save(compiled, tmp_path / "compiled.pt")
    loaded = torch.load(tmp_path / "compiled.pt", weights_only=False)
    assert isinstance(loaded, kiln.CompiledModule)
    assert list(loaded.state_dict()) == list(model.state_dict())
    torch.testing.assert_close(loaded(x), model(x))
