"""Kiln as a torch.compile backend: torch.compile(model, backend="kiln")."""

import importlib.metadata
import pathlib
import tomllib

import pytest
import torch
import torch._dynamo
from helpers import Block, assert_same_grads, copy_of

from kiln.dynamo import kiln_backend

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_entry_point_is_declared():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    target = project["entry-points"]["torch_dynamo_backends"]["kiln"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is kiln_backend


@pytest.fixture
def kiln_registered(tmp_path, monkeypatch):
    """torch finds backends in its entry-point group; install one pointing at Kiln's,
    as installing the kiln distribution does."""
    from torch._dynamo.backends import registry

    target = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][
        "torch_dynamo_backends"
    ]["kiln"]
    dist = tmp_path / "kiln_entry-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-entry\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[torch_dynamo_backends]\nkiln = {target}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._BACKENDS.pop("kiln", None)
    registry._COMPILER_FNS.pop("kiln", None)
    registry._discover_entrypoint_backends.cache_clear()
    registry._discover_entrypoint_backends()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_torch_compile_with_backend_kiln(kiln_registered, train):
    assert "kiln" in torch._dynamo.list_backends()
    torch.manual_seed(0)
    model = Block()
    reference = copy_of(model)
    compiled = torch.compile(model, backend="kiln")
    x = torch.randn(4, 16, requires_grad=train)
    x_ref = x.detach().clone().requires_grad_(train)
    out, expected = compiled(x), reference(x_ref)
    torch.testing.assert_close(out, expected)
    if train:
        out.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        assert_same_grads(model, reference)


def test_torch_compile_options_reach_kiln(kiln_registered, tmp_path):
    compiled = torch.compile(
        lambda x: (x.sin() + 1).sum(-1), backend="kiln", options={"debug_dir": str(tmp_path)}
    )
    compiled(torch.randn(4, 8))
    assert (tmp_path / "frame000" / "forward_kernels.cpp").exists()
