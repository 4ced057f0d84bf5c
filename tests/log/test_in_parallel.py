"""in_parallel: the blocking work of many logs (fsyncs, closes, small writes) on a few threads."""

import threading
import time

import pytest

from strom.log.index import in_parallel


def test_every_item_is_done_once_on_at_most_the_threads_asked_for() -> None:
    done: list[int] = []
    running, most = 0, 0
    lock = threading.Lock()

    def work(item: int) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.001)  # a blocking call: the others run meanwhile
        with lock:
            running -= 1
            done.append(item)

    in_parallel(work, list(range(500)), threads=4)
    assert sorted(done) == list(range(500))
    assert 1 < most <= 4


def test_the_first_failure_is_raised_and_no_new_item_begins_after_it() -> None:
    begun: list[int] = []

    def work(item: int) -> None:
        begun.append(item)
        if item == 10:
            raise OSError(28, "No space left on device")
        time.sleep(0.001)

    with pytest.raises(OSError, match="No space left"):
        in_parallel(work, list(range(10_000)), threads=4)
    assert 10 in begun
    assert len(begun) < 100  # the threads stopped taking items once one failed


def test_fewer_items_than_threads_and_one_item() -> None:
    seen: list[str] = []
    in_parallel(seen.append, ["a", "b"], threads=16)
    in_parallel(seen.append, ["c"], threads=16)
    in_parallel(seen.append, [], threads=16)
    assert sorted(seen) == ["a", "b", "c"]
