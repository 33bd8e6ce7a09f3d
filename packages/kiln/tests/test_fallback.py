"""A graph whose code generation fails runs its aten graph eagerly, with a warning."""

import pytest
import torch
from helpers import Block, assert_same_grads, copy_of

import kiln
import kiln_cpp


@pytest.fixture
def no_compiler(monkeypatch):
    """No C++ compiler for the test; kiln-cpp's host runtime, which remembers a failure to
    build for the rest of the process, forgets it after the test."""
    from kiln_cpp.host import runtime

    monkeypatch.setenv("KILN_CXX", "/nonexistent/c++")
    monkeypatch.setattr(runtime, "_FAILED", [])


def test_missing_compiler_falls_back_to_eager(no_compiler):
    torch.manual_seed(0)
    model = Block()
    reference = copy_of(model)
    compiled = kiln.compile(model, options={"cache": False})
    x = torch.randn(4, 16)
    with pytest.warns(RuntimeWarning) as caught:
        out = compiled(x)
        out.sum().backward()
    messages = [str(w.message) for w in caught]
    forward = [m for m in messages if "frame000 (Block.forward) forward graph runs eagerly" in m]
    backward = [m for m in messages if "frame000 (Block.forward) backward graph runs eagerly" in m]
    assert forward and backward, messages
    assert "cpp could not build the kernels: CppCompileError" in forward[0]
    # each points at the user's line that led to it (the call, the backward), not at Kiln
    assert {w.filename for w in caught if "runs eagerly" in str(w.message)} == {__file__}
    expected = reference(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    assert_same_grads(model, reference)


class FailingRender:
    """A code generator that cannot render anything."""

    name = "failing"
    device_types = ("cpu",)

    def render(self, kernel):
        raise kiln_cpp.CppCodegenError(f"{kernel.name} uses an op this generator lacks")

    def compile(self, sources):
        raise AssertionError("never reached")


def test_render_error_falls_back_and_names_the_reason(monkeypatch):
    import kiln_loopir

    real = kiln_loopir.resolve_codegen
    monkeypatch.setattr(
        kiln_loopir,
        "resolve_codegen",
        lambda codegen, device: FailingRender() if codegen is None else real(codegen, device),
    )

    def f(x):
        return (x.sin() + 1).sum(-1)

    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="uses an op this generator lacks"):
        out = kiln.compile(f, options={"cache": False})(x)
    torch.testing.assert_close(out, f(x))


def test_fallback_off_raises(no_compiler):
    compiled = kiln.compile(
        lambda x: x.cos() * 2, fullgraph=True, options={"cache": False, "fallback": False}
    )
    with pytest.raises(Exception, match="could not build the kernels"):
        compiled(torch.randn(3))


def test_no_codegen_for_the_device(monkeypatch):
    import kiln_loopir

    def none_installed(codegen, device):
        raise RuntimeError(f"no code generator for device {device!r} is installed")

    monkeypatch.setattr(kiln_loopir, "resolve_codegen", none_installed)
    x = torch.randn(3)
    with pytest.warns(RuntimeWarning, match="no code generator for device 'cpu'"):
        torch.testing.assert_close(kiln.compile(torch.tanh, backend="auto")(x), torch.tanh(x))
    with pytest.raises(Exception, match="no code generator for device 'cpu'"):
        kiln.compile(lambda x: x.tanh(), backend="kiln", fullgraph=True)(x)


def _one_eager_warning(caught) -> str:
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "\n" not in messages[0]  # one line; the traceback goes to the fallbacks log
    assert "kiln-capture runs" not in messages[0]  # not the whole frame
    return messages[0]


def test_an_autograd_error_costs_the_graph_not_the_frame(monkeypatch, caplog):
    import kiln_autograd

    def failing_aot(gm, *args, **kwargs):
        raise kiln_autograd.UnsupportedError("the graph holds aten.frobnicate.default")

    monkeypatch.setattr(kiln_autograd, "aot", failing_aot)
    caplog.set_level("INFO", logger="kiln.fallbacks")
    model = Block()
    reference = copy_of(model)
    x = torch.randn(4, 16)
    with pytest.warns(RuntimeWarning) as caught:
        out = kiln.compile(model, options={"cache": False})(x)
    message = _one_eager_warning(caught)
    assert "captured graph runs eagerly" in message
    assert "kiln-autograd" in message and "aten.frobnicate.default" in message
    out.sum().backward()  # the captured graph runs under eager autograd
    expected = reference(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    assert_same_grads(model, reference)
    assert any(r.exc_info for r in caplog.records if r.name == "kiln.fallbacks")


def test_a_lowering_error_costs_one_aten_graph(monkeypatch):
    import kiln_loopir

    def failing_compile_fx(gm, *args, **kwargs):
        raise AssertionError("an index the scheduler did not expect")

    monkeypatch.setattr(kiln_loopir, "compile_fx", failing_compile_fx)

    def f(x):
        return (x.sin() * 2).sum(-1)

    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning) as caught:
        out = kiln.compile(f, options={"cache": False})(x)
    message = _one_eager_warning(caught)
    assert "forward graph runs eagerly" in message and "kiln-loopir" in message
    assert "an index the scheduler did not expect" in message
    torch.testing.assert_close(out, f(x))


def test_an_internal_error_raises_with_fallback_off(monkeypatch):
    import kiln_loopir

    def failing_compile_fx(gm, *args, **kwargs):
        raise AssertionError("an index the scheduler did not expect")

    monkeypatch.setattr(kiln_loopir, "compile_fx", failing_compile_fx)
    compiled = kiln.compile(
        lambda x: x.cos() * 2, fullgraph=True, options={"cache": False, "fallback": False}
    )
    with pytest.raises(Exception, match="an index the scheduler did not expect"):
        compiled(torch.randn(3))
