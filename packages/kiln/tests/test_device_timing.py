"""Decisions timed on the device are taken once per shape: kept in the process and, while
a compile names a cache root, on disk, so that another process times nothing."""

import torch

from kiln import device_timing


def counting_decision(result):
    calls = []

    @device_timing.decided_once("test decision")
    def decide(m, n, dtype):
        calls.append((m, n, dtype))
        return result(m, n)

    return decide, calls


def test_a_decision_is_kept_on_disk_and_read_back_by_another_process(tmp_path):
    decide, calls = counting_decision(lambda m, n: m > n)
    with device_timing.decisions_in(tmp_path):
        assert decide(64, 8, torch.bfloat16) is True
        assert decide(8, 64, torch.bfloat16) is False
        assert decide(64, 8, torch.bfloat16) is True  # kept in the process
    assert len(calls) == 2
    assert len(list((tmp_path / "timings").glob("*.json"))) == 2
    decide.cache_clear()  # as a new process starts
    with device_timing.decisions_in(tmp_path):
        assert decide(64, 8, torch.bfloat16) is True
        assert decide(8, 64, torch.bfloat16) is False
        assert decide(64, 8, torch.float16) is True  # another dtype is another shape
    assert len(calls) == 3


def test_without_a_root_decisions_stay_in_the_process(tmp_path):
    decide, calls = counting_decision(lambda m, n: m > n)
    assert decide(64, 8, torch.float32) is True
    decide.cache_clear()
    assert decide(64, 8, torch.float32) is True
    assert len(calls) == 2
    assert not any(tmp_path.iterdir())


def test_a_decision_that_could_not_be_timed_is_not_kept(tmp_path):
    outcomes = iter([None, True])
    decide, calls = counting_decision(lambda m, n: next(outcomes))
    with device_timing.decisions_in(tmp_path):
        assert decide(64, 8, torch.float32) is False  # out of memory, say: not taken
        assert decide(64, 8, torch.float32) is True  # timed again
    assert len(calls) == 2


def test_a_damaged_file_is_timed_again(tmp_path):
    decide, calls = counting_decision(lambda m, n: True)
    with device_timing.decisions_in(tmp_path):
        decide(64, 8, torch.float32)
        (path,) = (tmp_path / "timings").glob("*.json")
        path.write_text("{not json")
        decide.cache_clear()
        assert decide(64, 8, torch.float32) is True
    assert len(calls) == 2
