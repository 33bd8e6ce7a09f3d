"""Modes: reduce-overhead (a kiln.runtime plug-in) and max-autotune."""

import textwrap
import warnings

import pytest
import torch

import kiln
from kiln import _plugins, runtime


def f(x):
    return (x * 3).tanh().sum(-1)


def test_reduce_overhead_on_the_cpu_warns_once_and_runs_the_default_mode():
    compiled = kiln.compile(f, mode="reduce-overhead")
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="runs in the default mode"):
        torch.testing.assert_close(compiled(x), f(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = torch.randn(5, 8)  # a recompile: no second warning
        torch.testing.assert_close(compiled(y), f(y))


def test_max_autotune_compiles_and_matches_eager():
    compiled = kiln.compile(f, mode="max-autotune")
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), f(x))
    assert compiled._session.config.options.max_autotune


def test_runtime_plugin_wraps_graphs_of_its_device(tmp_path, monkeypatch):
    (tmp_path / "kiln_fake_runtime.py").write_text(
        textwrap.dedent(
            """
            device_types = ("cuda",)

            def wrap(compiled, example_inputs, **hints):
                return ("replayed", compiled, example_inputs)
            """
        )
    )
    dist = tmp_path / "kiln_fake_runtime-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-fake-runtime\nVersion: 1.0\n")
    # named to come before kiln-cudagraphs's "cudagraphs", which serves cuda too
    (dist / "entry_points.txt").write_text("[kiln.runtime]\na_fake = kiln_fake_runtime\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _plugins.load_plugins.cache_clear()
    try:
        reduce_overhead = kiln.Options(cudagraphs=True)
        wrapped = runtime.wrap_for_mode(f, ["x"], reduce_overhead, torch.device("cuda"))
        assert wrapped == ("replayed", f, ["x"])
        default = runtime.wrap_for_mode(f, ["x"], kiln.Options(), torch.device("cuda"))
        assert default is f
    finally:
        _plugins.load_plugins.cache_clear()


def test_cuda_graphs_come_from_kiln_cudagraphs():
    kiln_cudagraphs = pytest.importorskip("kiln_cudagraphs")
    plugin, _ = runtime.find_runtime("cuda")
    assert plugin is kiln_cudagraphs
    plugin, reason = runtime.find_runtime("cpu")
    assert plugin is None
    assert "cudagraphs serves ['cuda'], not 'cpu'" in reason
