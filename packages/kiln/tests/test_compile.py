"""kiln.compile on functions and modules, with each backend, against eager."""

import inspect
import warnings

import pytest
import torch
from helpers import Block, assert_same_grads, copy_of

import kiln

BACKENDS = ["eager", "aot_eager", "kiln", "auto"]


def pointwise_and_reduce(x, y):
    return (torch.sin(x) * y + 1).relu().sum(-1), x.cos()


@pytest.mark.parametrize("backend", BACKENDS)
def test_function_matches_eager(backend):
    compiled = kiln.compile(pointwise_and_reduce, backend=backend)
    for _ in range(2):  # the second call reuses the compiled graph
        x, y = torch.randn(8, 32), torch.randn(8, 32)
        torch.testing.assert_close(compiled(x, y), pointwise_and_reduce(x, y))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_module_matches_eager(backend, train):
    torch.manual_seed(0)
    model = Block()
    reference = copy_of(model)
    compiled = kiln.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(4, 16, requires_grad=train)
        x_ref = x.detach().clone().requires_grad_(train)
        out, expected = compiled(x), reference(x_ref)
        torch.testing.assert_close(out, expected)
        if train:
            weights = torch.randn_like(out)
            (out * weights).sum().backward()
            (expected * weights).sum().backward()
            torch.testing.assert_close(x.grad, x_ref.grad)
            assert_same_grads(model, reference)
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)


def test_kiln_backend_generates_kernels(tmp_path):
    compiled = kiln.compile(pointwise_and_reduce, options={"debug_dir": str(tmp_path)})
    compiled(torch.randn(8, 32), torch.randn(8, 32))
    kernels = (tmp_path / "frame000" / "forward_kernels.cpp").read_text()
    assert 'extern "C"' in kernels


def test_decorator_forms():
    @kiln.compile
    def plain(x):
        return x * 2 + 1

    @kiln.compile(backend="aot_eager")
    def with_arguments(x):
        return x.exp() - 1

    x = torch.randn(5)
    torch.testing.assert_close(plain(x), x * 2 + 1)
    torch.testing.assert_close(with_arguments(x), x.exp() - 1)
    assert plain.__name__ == "plain"
    assert isinstance(plain, kiln.CompiledFunction)


def test_a_compiled_method_has_the_methods_signature():
    """What ``inspect.signature`` says (Hugging Face's ``generate`` reads the forward's at
    every step): the bound method's, without ``self``."""

    class Model(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, *, cache=None):
            return input_ids * 2

    model = Model()
    expected = inspect.signature(model.forward)
    model.forward = kiln.compile(model.forward)
    assert inspect.signature(model.forward) == expected
    assert list(inspect.signature(model.forward).parameters) == [
        "input_ids",
        "attention_mask",
        "cache",
    ]


def test_decorated_method():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.randn(8))

        @kiln.compile(backend="aot_eager")
        def forward(self, x):
            return x * self.scale

    model = Scaled()
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x), x * model.scale)


def test_callable_backend_gets_torch_compile_contract():
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    compiled = kiln.compile(pointwise_and_reduce, backend=backend)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    torch.testing.assert_close(compiled(x, y), pointwise_and_reduce(x, y))
    ((gm, example_inputs),) = seen
    assert isinstance(gm, torch.fx.GraphModule)
    assert all(isinstance(t, torch.Tensor) for t in example_inputs)


def test_disable_argument_returns_the_model():
    model = Block()
    assert kiln.compile(model, disable=True) is model
    assert kiln.compile(disable=True)(pointwise_and_reduce) is pointwise_and_reduce


def test_kiln_disable():
    calls = []

    def backend(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    compiled = kiln.compile(pointwise_and_reduce, backend=backend)
    assert kiln.disable(compiled) is pointwise_and_reduce
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    with kiln.disable():
        torch.testing.assert_close(compiled(x, y), pointwise_and_reduce(x, y))
    assert calls == [], "a compiled function runs eagerly inside kiln.disable()"

    @kiln.disable
    def outer(x, y):
        return compiled(x, y)

    outer(x, y)
    assert calls == []
    compiled(x, y)
    assert len(calls) == 1


def test_reset_captures_again():
    calls = []

    def backend(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    compiled = kiln.compile(pointwise_and_reduce, backend=backend)
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    compiled(x, y)
    compiled(x, y)
    assert len(calls) == 1
    kiln.reset()
    compiled(x, y)
    assert len(calls) == 2


def test_recompiling_an_already_compiled_model_compiles_the_original():
    model = Block()
    once = kiln.compile(model, backend="eager")
    twice = kiln.compile(once, backend="aot_eager")
    assert twice._orig_mod is model


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"backend": "inductor"}, ValueError, "not a Kiln backend"),
        ({"backend": 3}, TypeError, "takes a name or a callable"),
        ({"mode": "fast"}, ValueError, "not a mode"),
        ({"dynamic": "yes"}, TypeError, "True, False or None"),
        ({"options": {"debug": "/tmp"}}, ValueError, "unknown option(s) ['debug']"),
        ({"options": {"fusion": "no"}}, TypeError, "takes a bool"),
        ({"options": {"partitioner": "greedy"}}, ValueError, "partitioner"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, words):
    with pytest.raises(error) as info:
        kiln.compile(pointwise_and_reduce, **kwargs)
    assert words in str(info.value)


def test_not_callable_is_refused():
    with pytest.raises(TypeError, match="takes a function or an nn.Module"):
        kiln.compile(42)


def norm_plus_constant(x):
    # a tensor constant (a get_attr node) in a graph kiln-loopir decomposes (layer norm)
    return torch.nn.functional.layer_norm(x, (4,)) + torch.tensor([1.0, 2.0, 3.0, 4.0])


def test_graph_with_tensor_constants_runs_generated_code(tmp_path):
    compiled = kiln.compile(norm_plus_constant, options={"debug_dir": str(tmp_path)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        for _ in range(2):
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x), norm_plus_constant(x))
    assert (tmp_path / "frame000" / "forward_kernels.cpp").exists()


def matmul_softmax(x, w):
    return torch.softmax(x @ w, -1).sum(0)


@pytest.mark.parametrize("dynamic", [True, None])
def test_dynamic_shapes_through_the_whole_stack(dynamic, tmp_path):
    compiled = kiln.compile(matmul_softmax, dynamic=dynamic, options={"debug_dir": str(tmp_path)})
    w = torch.randn(8, 8)
    for n in (5, 9, 13):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x, w), matmul_softmax(x, w))
    # dynamic=True: one frame for every size; None: a second after the size changed
    frames = sorted(p.name for p in tmp_path.iterdir())
    assert frames == (["frame000"] if dynamic else ["frame000", "frame001"])


def test_explain_reports_graphs_and_breaks():
    def with_break(x):
        y = x.sin()
        print("a graph break")  # noqa: T201
        return y.cos()

    report = kiln.explain(kiln.compile(with_break))(torch.randn(3))
    assert report.graph_count == 2
    assert len(report.graph_breaks) == 1
    assert "def guard(" in str(report)


def test_views_of_another_dtype_keep_their_dtype(tmp_path):
    def views(x):
        return torch.view_as_complex(x), x.view(torch.int32), (x * 2).sum()

    compiled = kiln.compile(views, options={"debug_dir": str(tmp_path), "cache": False})
    x = torch.randn(6, 2)
    got, want = compiled(x), views(x)
    assert (tmp_path / "frame000" / "forward_kernels.cpp").exists()  # compiled, not eager
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)
    assert got[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # a view


def test_transformer_encoder_layer_in_eval_compiles_whole(tmp_path):
    # its forward walks `self.modules()` before choosing torch's fast path
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), layer).eval()
    compiled = kiln.compile(model, options={"debug_dir": str(tmp_path), "cache": False})
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", RuntimeWarning)  # no eager fallback
        for _ in range(2):
            x = torch.randn(3, 5, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert [p.name for p in tmp_path.iterdir()] == ["frame000"]  # one frame, no resume
    assert 'extern "C"' in (tmp_path / "frame000" / "forward_kernels.cpp").read_text()
