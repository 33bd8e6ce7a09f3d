"""Plug-in discovery: installed plug-ins load, broken ones are skipped with a reason."""

import textwrap

import pytest

import kiln
from kiln import _plugins


@pytest.fixture
def fresh_loader():
    _plugins.load_plugins.cache_clear()
    yield
    _plugins.load_plugins.cache_clear()


def _install_fake_distribution(root, name, group, entry_name, module, module_source):
    (root / f"{module}.py").write_text(textwrap.dedent(module_source))
    dist_info = root / f"{name}-1.2.3.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (dist_info / "entry_points.txt").write_text(f"[{group}]\n{entry_name} = {module}\n")


def test_sibling_plugins_are_registered(fresh_loader):
    found = {(p.group, p.name): p for p in kiln.list_backends()}
    assert found[("kiln.codegen", "cpp")].distribution == "kiln-cpp"
    assert found[("kiln.runtime", "cudagraphs")].distribution == "kiln-cudagraphs"
    assert ("kiln.codegen", "triton") in found
    assert found[("kiln.codegen", "cpp")].loaded


def test_broken_plugin_is_skipped_with_its_reason(tmp_path, monkeypatch, fresh_loader):
    _install_fake_distribution(
        tmp_path,
        "kiln-broken",
        "kiln.codegen",
        "broken",
        "kiln_broken_codegen",
        "raise ImportError('needs libfoo.so, which is not installed')\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {p.name: p for p in kiln.list_backends() if p.group == "kiln.codegen"}
    broken = found["broken"]
    assert not broken.loaded
    assert broken.obj is None
    assert "needs libfoo.so" in broken.error
    assert "failed to load" in broken.describe()
    assert found["cpp"].loaded, "one broken plug-in must not stop the others"


def test_working_plugin_object_is_loaded(tmp_path, monkeypatch, fresh_loader):
    _install_fake_distribution(
        tmp_path,
        "kiln-extra",
        "kiln.runtime",
        "extra",
        "kiln_extra_runtime",
        "DEVICE_TYPES = ('meta',)\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = next(p for p in kiln.list_backends() if p.name == "extra")
    assert extra.loaded
    assert extra.obj.DEVICE_TYPES == ("meta",)
    assert (extra.distribution, extra.version) == ("kiln-extra", "1.2.3")


def test_each_group_is_loaded_once(fresh_loader):
    assert _plugins.load_plugins("kiln.codegen") is _plugins.load_plugins("kiln.codegen")


class PreparingCodegen:
    """A code generator for CUDA that counts its ``prepare()`` calls."""

    device_types = ("cuda",)
    prepared = 0

    def render(self, kernel):
        raise NotImplementedError

    def compile(self, sources):
        raise NotImplementedError

    def prepare(self):
        PreparingCodegen.prepared += 1


def test_on_a_machine_with_cuda_the_gpu_codegen_prepares_as_kiln_compile_is_called(
    monkeypatch,
):
    import torch

    import kiln_loopir

    asked = []

    def resolve(codegen, device_type):
        asked.append((codegen, device_type))
        return PreparingCodegen()

    monkeypatch.setattr(kiln_loopir, "resolve_codegen", resolve)
    monkeypatch.setattr(PreparingCodegen, "prepared", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    kiln.compile(lambda x: x + 1)
    assert PreparingCodegen.prepared == 0 and asked == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kiln.compile(lambda x: x + 1, options={"codegen": "triton"})
    assert PreparingCodegen.prepared == 1 and asked == [("triton", "cuda")]
    kiln.compile(lambda x: x + 1, backend="aot_eager")  # no code generator runs
    assert PreparingCodegen.prepared == 1
