"""The garbage collector paused while a corpus is built."""

from __future__ import annotations

import gc

from dlmstore.collector import paused


def test_the_collector_is_off_in_a_pause_and_on_after_with_what_it_built_out_of_the_young_generation() -> (
    None
):
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        built = [[index] for index in range(5000)]  # 5,000 tracked objects
        assert gc.get_count()[0] >= 5000
    assert gc.isenabled()
    assert gc.get_count()[0] < 100  # moved on: the next collection will not walk them
    assert len(built) == 5000 and gc.get_freeze_count() == 0  # nothing left frozen


def test_a_pause_inside_a_pause_or_with_the_collector_off_leaves_it_off() -> None:
    with paused():
        with paused():
            pass
        assert not gc.isenabled()
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
