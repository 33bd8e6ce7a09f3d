"""A warm start reads what the rewrites made of an aten graph (kiln/rewrite_records.py)
instead of rewriting it: batch norms are not folded again, the frozen values are computed
from the new process's weights, and a record that cannot serve costs a rewrite, never a
result."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from test_freezing import ConvBlock, randomized

import kiln
from kiln import folding


@pytest.fixture
def folds(monkeypatch):
    """How many times batch norms were folded (graphs rewritten by freezing)."""
    count = [0]
    real = folding.fold_batch_norms

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(folding, "fold_batch_norms", counting)
    return count


def rewrite_records(root):
    return sorted((root / "graphs").rglob("*.rewrites"))


def fresh_block_checked(options) -> kiln.CompiledModule:
    """A compile in a "new process" (``kiln.reset()``) of a block with weights of its own,
    checked against eager on a fresh input with no graph running eagerly."""
    kiln.reset()
    model = randomized(ConvBlock())
    x = torch.randn(2, 3, 12, 12)
    compiled = kiln.compile(model, options=options)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        actual = compiled(x)
        expected = model.forward(x)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    return model, compiled


def test_a_warm_start_does_not_fold_batch_norms_again(tmp_path, folds):
    options = {"cache_dir": str(tmp_path)}
    fresh_block_checked(options)
    assert folds[0] == 1 and len(rewrite_records(tmp_path)) == 1
    assert kiln.compile_times()["rewrite"] > 0
    model, compiled = fresh_block_checked(options)
    assert folds[0] == 1, "the warm start rewrote the graph"
    times = kiln.compile_times()
    assert "rewrite" not in times and "loopir" not in times
    with torch.no_grad():  # the state graph read from the record follows the weights
        model.norm.running_var.add_(2.0)
        model.pointwise.weight.mul_(-1.5)
        x = torch.randn(2, 3, 12, 12)
        torch.testing.assert_close(compiled(x), model.forward(x), rtol=1e-5, atol=1e-5)


def test_a_record_whose_compiled_graph_is_gone_is_rewritten(tmp_path, folds):
    options = {"cache_dir": str(tmp_path)}
    fresh_block_checked(options)
    for entry in (tmp_path / "graphs").rglob("*.pt"):
        entry.unlink()
    fresh_block_checked(options)
    assert folds[0] == 2
    assert "loopir" in kiln.compile_times()


def test_a_corrupt_record_is_ignored_and_written_again(tmp_path, folds, caplog):
    options = {"cache_dir": str(tmp_path)}
    fresh_block_checked(options)
    (record,) = rewrite_records(tmp_path)
    record.write_bytes(record.read_bytes()[:-40])
    with caplog.at_level(logging.WARNING, logger="kiln.cache"):
        fresh_block_checked(options)
    assert "ignoring corrupt cache entry" in caplog.text
    assert folds[0] == 2
    fresh_block_checked(options)  # the record written again serves the next start
    assert folds[0] == 2


def test_a_graph_the_rewrites_leave_as_it_is_is_not_rewritten_warm(tmp_path, monkeypatch):
    options = {"cache_dir": str(tmp_path)}
    calls = []
    real = kiln.pipeline.AtenCompiler.rewrite

    def counting(self, *args):
        calls.append(self.kind)
        return real(self, *args)

    monkeypatch.setattr(kiln.pipeline.AtenCompiler, "rewrite", counting)
    for _ in range(2):
        kiln.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
        x = torch.randn(3, 8)
        compiled = kiln.compile(model, options=options)
        compiled(x).sum().backward()
    assert sorted(calls) == ["backward", "forward"]  # the cold start's only
    assert len(rewrite_records(tmp_path)) == 2


def test_cache_off_keeps_no_record(tmp_path, folds):
    fresh_block_checked({"cache": False, "cache_dir": str(tmp_path)})
    assert not rewrite_records(tmp_path)
