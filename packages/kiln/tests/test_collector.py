"""Fewer garbage-collector passes while a compile runs, undone after."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import kiln
from kiln import collector


@pytest.fixture(autouse=True)
def plain_collector():
    """Each test starts from CPython's usual state: nothing frozen, the collector on."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.unfreeze()
    gc.enable()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_a_compile_freezes_what_exists_and_collects_less_until_it_ends():
    before = gc.get_threshold()
    with collector.collecting_less():
        assert gc.get_freeze_count() > 0
        young, *older = gc.get_threshold()
        assert young >= collector.YOUNG and all(t >= collector.OLDER for t in older)
        garbage = [[]]
        garbage[0].append(garbage)  # a cycle made while compiling is still collected
        del garbage
        assert gc.collect() >= 1
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_overlapping_compiles_undo_it_when_the_last_ends():
    before = gc.get_threshold()
    started, release = threading.Event(), threading.Event()

    def backward_ahead():
        with collector.collecting_less():
            started.set()
            release.wait(10)

    thread = threading.Thread(target=backward_ahead)
    with collector.collecting_less():
        thread.start()
        started.wait(10)
    assert gc.get_freeze_count() > 0 and gc.get_threshold() != before  # one still runs
    release.set()
    thread.join(10)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_or_stopped_the_collector_is_left_alone():
    gc.freeze()
    frozen = gc.get_freeze_count()
    with collector.collecting_less():
        pass
    assert gc.get_freeze_count() == frozen  # not unfrozen by the compile
    gc.unfreeze()
    gc.disable()
    before = gc.get_threshold()
    with collector.collecting_less():
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert not gc.isenabled()


def test_kiln_compiles_with_less_collection_and_restores_it(monkeypatch):
    seen = []

    def fn(x):
        return (x.sin() * 2).relu()

    real = collector._begin

    def begin():
        real()
        seen.append((gc.get_freeze_count() > 0, gc.get_threshold()[0]))

    before = gc.get_threshold()
    monkeypatch.setattr(collector, "_begin", begin)
    compiled = kiln.compile(fn)
    x = torch.randn(64, 32)
    torch.testing.assert_close(compiled(x), fn(x))
    assert seen and seen[0] == (True, max(before[0], collector.YOUNG))
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
