"""A graph whose code generation fails runs its aten graph eagerly, with a warning."""

import pytest
import torch
from helpers import Block, assert_same_grads, copy_of

import kiln
import kiln_cpp


def test_missing_compiler_falls_back_to_eager(monkeypatch):
    monkeypatch.setenv("KILN_CXX", "/nonexistent/c++")
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


def test_fallback_off_raises(monkeypatch):
    monkeypatch.setenv("KILN_CXX", "/nonexistent/c++")
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
