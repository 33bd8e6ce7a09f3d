"""Automatic garbage collection is paused while a graph compiles, and left as it was."""

import gc

from kiln_loopir.collection import collection_paused


def test_collection_is_paused_inside_and_on_again_after():
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
        with collection_paused():  # nested: the outer pause ends it
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collection_turned_off_by_the_user_stays_off():
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collection_is_on_again_after_an_error():
    try:
        with collection_paused():
            raise ValueError("a compile failed")
    except ValueError:
        pass
    assert gc.isenabled()
