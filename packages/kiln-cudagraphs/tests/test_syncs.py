"""The host-sync watch, without CUDA: torch's sync debug mode is replaced by a stand-in that
warns as torch does on each synchronising operation while the mode is not "default"."""

import warnings

import pytest
import torch

from kiln_cudagraphs.syncs import MODE_NOTICE, SYNC_WARNING, run_watching_host_syncs


class SyncDebugMode:
    def __init__(self, mode=0):
        self.mode = mode
        self.modes_seen = []

    def get(self):
        return self.mode

    def set(self, mode):
        if mode and not self.modes_seen:  # torch's notice, once a process
            warnings.warn(f"{MODE_NOTICE} and does not yet detect ...", UserWarning, stacklevel=2)
        self.mode = mode
        self.modes_seen.append(mode)

    def item(self, x):  # what x.item() does on a CUDA tensor under each mode
        if self.mode == 2:
            raise RuntimeError(SYNC_WARNING)
        if self.mode == 1:
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=2)
        return x.item()


@pytest.fixture
def debug_mode(monkeypatch):
    mode = SyncDebugMode()
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", mode.get)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", mode.set)
    return mode


def test_a_sync_is_reported_and_the_result_kept(debug_mode):
    x = torch.randn(8)
    result, sync = run_watching_host_syncs(lambda: (x / debug_mode.item(x.abs().max()),))
    torch.testing.assert_close(result[0], x / x.abs().max())
    assert sync == SYNC_WARNING
    assert debug_mode.modes_seen == [1, 0] and debug_mode.mode == 0  # set back


def test_no_sync_no_report_and_other_warnings_still_shown(debug_mode):
    x = torch.randn(8)

    def fn():
        warnings.warn("something else", DeprecationWarning, stacklevel=1)
        return (x * 2,)

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        result, sync = run_watching_host_syncs(fn)
    torch.testing.assert_close(result[0], x * 2)
    assert sync is None
    # the block's own warning is shown; torch's notice on setting the mode is the watch's
    assert [str(w.message) for w in shown] == ["something else"]


def test_mode_is_set_back_when_the_run_raises(debug_mode):
    def fn():
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        run_watching_host_syncs(fn)
    assert debug_mode.mode == 0


def test_a_mode_the_user_chose_is_respected(debug_mode):
    x = torch.randn(8)
    debug_mode.mode = 2  # "error": the sync raises, as it would without the watch
    with pytest.raises(RuntimeError, match=SYNC_WARNING):
        run_watching_host_syncs(lambda: debug_mode.item(x.sum()))
    assert debug_mode.mode == 2
    debug_mode.mode = 1  # "warn": the user sees the warning, and the watch reports it
    with pytest.warns(UserWarning, match=SYNC_WARNING):
        _, sync = run_watching_host_syncs(lambda: debug_mode.item(x.sum()))
    assert sync == SYNC_WARNING and debug_mode.mode == 1
