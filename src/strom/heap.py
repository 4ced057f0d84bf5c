"""The garbage collector at 100,000 partitions.

CPython's full collection walks every tracked object, and a broker hosting 100,000 partitions
has millions (logs, segments, indexes, partition states, metadata). A full pass then holds the
GIL for seconds: the event loop answered nothing for 4-5 s, twice a minute, with one producer
and nothing else to do. What a partition is made of lives as long as the partition, so after
a change that hosts or describes many partitions at once, the survivors are moved out of the
collector's scans (gc.freeze). They are still freed by reference counting when their
partition goes: none of them is part of a reference cycle (tests/server/test_heap.py checks
it), which is the only garbage frozen objects would keep.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

BULK_CHANGE = 1000  # partitions changed in all before a freeze
SMALL_CHANGE = 100  # a change of fewer partitions does not count
SLOW_COLLECTION_S = 0.2
_started: list[float] = []
_unsettled = [0]  # partitions changed since the last freeze


def settle_after_bulk_change(partitions: int) -> None:
    """`partitions` partitions were just hosted, loaded or described: once a thousand or more
    have been since the last time, keep what they made (and what start-up made) out of later
    full collections. The young generations are collected first, so that garbage of the change
    itself is freed, not frozen. Small changes (an ISR here and there) do not count: freezing
    after each would also keep the odd garbage cycle that reached the old generation."""
    if partitions < SMALL_CHANGE:
        return
    _unsettled[0] += partitions
    if _unsettled[0] >= BULK_CHANGE:
        _unsettled[0] = 0
        gc.collect(1)
        gc.freeze()


_pause_lock = threading.Lock()
_pauses = [0, True]  # collections_paused() blocks running now (any thread); was gc enabled


@contextmanager
def collections_paused() -> Iterator[None]:
    """No automatic collection while a block builds a great many long-lived objects (the
    requests of a change of 100,000 partitions): each young collection would find them alive
    and pass them on, and the full collections that follow walked them again and again (more
    than half of building those requests). Reference counting frees garbage meanwhile; garbage
    cycles wait for the collection after. Nested and concurrent blocks (the controller's thread
    and the broker's) resume collection when the last one ends."""
    with _pause_lock:
        _pauses[0] += 1
        if _pauses[0] == 1:
            _pauses[1] = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _pause_lock:
            _pauses[0] -= 1
            if _pauses[0] == 0 and _pauses[1]:
                gc.enable()


def _on_collection(phase: str, info: dict) -> None:
    if info.get("generation") != 2:
        return
    if phase == "start":
        _started.append(time.monotonic())
    elif _started:
        took = time.monotonic() - _started.pop()
        if took >= SLOW_COLLECTION_S:
            log.warning("a full garbage collection held the broker for %.2fs", took)


def watch_collections() -> None:
    """Log the full collections that pause the broker noticeably (one line each)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)
