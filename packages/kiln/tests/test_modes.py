"""Modes: reduce-overhead (a kiln.runtime plug-in) and max-autotune."""

import textwrap
import warnings

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

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
                fresh, limit = hints["fresh_outputs"], hints["max_copy_bytes"]
                return ("replayed", compiled, example_inputs, fresh, limit, hints["warmups"])
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
        cuda, big = torch.device("cuda"), runtime.MIN_GRAPH_STEPS
        reduce_overhead = kiln.Options(cudagraphs=True)
        wrapped = runtime.wrap_for_mode(f, ["x"], reduce_overhead, cuda, steps=1)
        assert wrapped == ("replayed", f, ["x"], False, None, 1)  # outputs over graph memory
        # the default mode replays graphs big enough to gain, with outputs of their own
        default = kiln.Options()
        limit = big * runtime.COPY_BYTES_PER_STEP  # bytes of outputs copied, at most
        assert runtime.wrap_for_mode(f, ["x"], default, cuda, steps=big) == (
            "replayed", f, ["x"], True, limit, 1
        )  # fmt: skip
        # a graph of symbolic sizes records a size once it came back a few times
        size = ShapeEnv().create_unbacked_symint()
        wrapped = runtime.wrap_for_mode(f, [size], default, cuda, steps=big)
        assert wrapped[-1] == runtime.SIZE_WARMUPS > 1
        assert runtime.wrap_for_mode(f, [size], reduce_overhead, cuda, steps=big)[-1] == 1
        assert runtime.wrap_for_mode(f, ["x"], default, cuda, steps=big - 1) is f
        assert runtime.wrap_for_mode(f, ["x"], default, torch.device("cpu"), steps=big) is f
        launches = kiln.Options(cudagraphs=False)
        assert runtime.wrap_for_mode(f, ["x"], launches, cuda, steps=big) is f
    finally:
        _plugins.load_plugins.cache_clear()


def test_cuda_graphs_come_from_kiln_cudagraphs():
    kiln_cudagraphs = pytest.importorskip("kiln_cudagraphs")
    plugin, _ = runtime.find_runtime("cuda")
    assert plugin is kiln_cudagraphs
    plugin, reason = runtime.find_runtime("cpu")
    assert plugin is None
    assert "cudagraphs serves ['cuda'], not 'cpu'" in reason


def test_cudagraphs_option_is_checked():
    with pytest.raises(TypeError, match="'cudagraphs'.*True, False or None"):
        kiln.compile(f, options={"cudagraphs": "yes"})
    with pytest.raises(ValueError, match="drop one of the two"):
        kiln.compile(f, mode="reduce-overhead", options={"cudagraphs": False})
    assert kiln.compile(f)._session.config.options.cudagraphs is None
    assert kiln.compile(f, mode="reduce-overhead")._session.config.options.cudagraphs is True
