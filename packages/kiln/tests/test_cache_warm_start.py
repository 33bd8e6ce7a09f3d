"""A warm start: kiln-autograd's records spare a second compile the tracing, and the graph
cache its lowering; a missing graph entry or a corrupt record costs a trace, not a result."""

import copy
import logging

import pytest
import torch
from helpers import Block

import kiln
import kiln_autograd.trace


@pytest.fixture
def traces(monkeypatch):
    """How many graphs kiln-autograd traced (make_fx calls)."""
    count = [0]
    real = kiln_autograd.trace.make_fx

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(kiln_autograd.trace, "make_fx", counting)
    return count


def records(root):
    return sorted((root / "graphs").rglob("*.record"))


def train_step(options, dynamic=None):
    """One compiled training step on fresh inputs, checked against eager (output, grads)."""
    torch.manual_seed(0)
    model = Block()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 16)
    compiled = kiln.compile(model, options=options, dynamic=dynamic)
    out = compiled(x)
    expected = eager(x)
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_a_warm_start_does_not_trace(tmp_path, traces, warnings_are_errors):
    options = {"cache_dir": str(tmp_path)}
    train_step(options)
    assert traces[0] == 1 and len(records(tmp_path)) == 1
    kiln.reset()
    train_step(options)
    assert traces[0] == 1, "the second compile traced"
    times = kiln.compile_times()
    assert "loopir" not in times and "cache_load" in times and "autograd_cache" in times


def test_inference_warm_start_does_not_trace(tmp_path, traces, warnings_are_errors):
    options = {"cache_dir": str(tmp_path)}
    x = torch.randn(4, 16)
    for _ in range(2):
        kiln.reset()
        torch.manual_seed(0)
        model = Block()
        with torch.no_grad():
            torch.testing.assert_close(kiln.compile(model, options=options)(x), model(x))
    assert traces[0] == 1
    assert "loopir" not in kiln.compile_times()


def test_a_missing_graph_entry_is_traced_and_lowered(tmp_path, traces, warnings_are_errors):
    options = {"cache_dir": str(tmp_path)}
    train_step(options)
    entries = sorted((tmp_path / "graphs").rglob("*.pt"))
    assert len(entries) == 2  # forward and backward
    entries[0].unlink()
    kiln.reset()
    train_step(options)  # NeedsTrace from the compiler: traced again, still right
    assert traces[0] == 2
    assert "loopir" in kiln.compile_times()
    kiln.reset()
    train_step(options)
    assert traces[0] == 2 and "loopir" not in kiln.compile_times()


def test_a_corrupt_record_is_ignored_and_rewritten(tmp_path, traces, caplog):
    options = {"cache_dir": str(tmp_path)}
    train_step(options)
    (record,) = records(tmp_path)
    good = record.read_bytes()
    record.write_bytes(good[: len(good) // 2])
    kiln.reset()
    with caplog.at_level(logging.WARNING, logger="kiln.cache"):
        train_step(options)
    assert any("ignoring corrupt cache entry" in r.getMessage() for r in caplog.records)
    assert traces[0] == 2
    assert record.read_bytes() == good, "the record was written again"


def test_dynamic_shapes_store_no_record(tmp_path):
    train_step({"cache_dir": str(tmp_path)}, dynamic=True)
    assert records(tmp_path) == []


def test_cache_off_stores_no_record(tmp_path, traces):
    options = {"cache_dir": str(tmp_path), "cache": False}
    train_step(options)
    kiln.reset()
    train_step(options)
    assert traces[0] == 2 and records(tmp_path) == []
