"""Dead letters of share groups (KIP-1191's design), in-process: the pending states a share
partition keeps until its dead letters are in the topic, and the records the writer builds and
looks for (strom.share.dead_letters)."""

from __future__ import annotations

from strom.coordinator.share.share_partition import (
    ACCEPT,
    ARCHIVED,
    DEAD_LETTER_EXHAUSTED,
    DEAD_LETTER_REJECTED,
    GAP,
    REJECT,
    RELEASE,
    LogBatch,
    SharePartition,
    ShareState,
    StateBatch,
)
from strom.protocol.records import Record, build_batch, iter_records
from strom.share.dead_letters import (
    CLIENT_REJECT,
    DELIVERY_COUNT_EXCEEDED,
    build_dead_letters,
    check_topic,
    own_dead_letters,
    source_records,
)

LOCK = 1000


def with_dead_letters(limit: int = 2, state: ShareState | None = None) -> SharePartition:
    sp = SharePartition(0, delivery_limit=limit, max_in_flight=100, state=state)
    sp.dead_letters = True
    return sp


def test_a_rejected_record_is_pending_until_its_dead_letter_is_written():
    sp = with_dead_letters()
    sp.acquire("m", [LogBatch(0, 3)], 10, 0, LOCK)
    assert sp.acknowledge("m", [(0, 0, [ACCEPT]), (1, 2, [REJECT]), (3, 3, [GAP])]) == 0
    # Pending dead letters hold the window; the GAP is archived as before.
    assert [sp.records[o].state for o in (1, 2, 3)] == [DEAD_LETTER_REJECTED, DEAD_LETTER_REJECTED, ARCHIVED]
    assert sp.start_offset == 1
    # Persisted as Strom's own state, and handed on only once a write that carries them succeeded.
    assert sp.state().batches[0] == StateBatch(1, 2, DEAD_LETTER_REJECTED, 1)
    carried = sp.snapshot_dead_letters()
    assert carried == {1, 2} and not sp.ready
    assert sp.snapshot_dead_letters() == frozenset()
    sp.dead_letters_persisted(carried, ok=True)
    assert sp.ready == {1, 2}
    sp.dirty = False
    assert sp.dead_letters_written([1, 2]) and sp.dirty
    assert sp.start_offset == 4 and not sp.ready
    assert not sp.dead_letters_written([1])  # already archived


def test_a_failed_write_carries_the_dead_letters_again():
    sp = with_dead_letters()
    sp.acquire("m", [LogBatch(0, 0)], 10, 0, LOCK)
    sp.acknowledge("m", [(0, 0, [REJECT])])
    sp.dead_letters_persisted(sp.snapshot_dead_letters(), ok=False)
    assert not sp.ready and sp.snapshot_dead_letters() == {0}


def test_records_out_of_deliveries_become_dead_letters_by_release_and_lock_expiry():
    sp = with_dead_letters(limit=2)
    sp.acquire("m", [LogBatch(0, 1)], 10, 0, LOCK)
    sp.acknowledge("m", [(0, 1, [RELEASE])])
    sp.acquire("m", [LogBatch(0, 1)], 10, 0, LOCK)  # delivery 2 of 2
    sp.acknowledge("m", [(0, 0, [RELEASE])])
    assert sp.records[0].state == DEAD_LETTER_EXHAUSTED and sp.records[0].delivery_count == 2
    assert sp.expire_locks(LOCK)
    assert sp.records[1].state == DEAD_LETTER_EXHAUSTED
    # Not acquired again, whatever comes.
    assert sp.acquire("m", [LogBatch(0, 1)], 10, 2 * LOCK, LOCK) == []


def test_without_a_dead_letter_topic_records_are_archived_at_once():
    sp = SharePartition(0, delivery_limit=2, max_in_flight=100)
    sp.acquire("m", [LogBatch(0, 0)], 10, 0, LOCK)
    sp.acknowledge("m", [(0, 0, [REJECT])])
    assert sp.start_offset == 1 and sp.snapshot_dead_letters() == frozenset()


def test_a_restored_pending_dead_letter_is_looked_for_before_it_is_written():
    state = ShareState(5, [StateBatch(5, 6, DEAD_LETTER_EXHAUSTED, 2), StateBatch(7, 7, ARCHIVED, 1),
                           StateBatch(8, 8, DEAD_LETTER_REJECTED, 1)])
    sp = with_dead_letters(state=state)
    assert sp.recovering == {5, 6, 8} and not sp.ready and sp.start_offset == 5
    assert sp.acquire("m", [LogBatch(5, 8)], 10, 0, LOCK) == []
    sp.dead_letters_written([5, 6])  # found in the topic
    assert sp.start_offset == 8 and sp.recovering == {8}
    sp.move_start(9)  # the log lost it: nothing to write any more
    assert sp.recovering == set()


def test_a_restored_record_at_its_limit_becomes_a_dead_letter_when_met():
    sp = with_dead_letters(limit=2, state=ShareState(0, [StateBatch(0, 0, 0, 2)]))
    assert sp.acquire("m", [LogBatch(0, 1)], 10, 0, LOCK)[0].first_offset == 1
    assert sp.records[0].state == DEAD_LETTER_EXHAUSTED and sp.dead_letters_to_persist
    assert sp.snapshot_dead_letters() == {0} and not sp.dead_letters_to_persist


def test_kafka_checks_of_the_topic_in_their_order():
    assert check_topic("g", "", True, True, True, "dlq.") == "Configured DLQ topic name in share group: g is empty."
    assert check_topic("g", "__x", True, True, True, "") == \
        "Configured DLQ topic name in share group: g cannot start with __, topic: __x."
    assert check_topic("g", "dlq.t", True, False, True, "dlq.") == \
        "DLQ is not enabled on configured DLQ topic for share group: g, topic: dlq.t."
    assert check_topic("g", "dlq.t", False, False, False, "dlq.") == \
        "DLQ topic does not exist and auto create is disabled on cluster for share group: g, topic: dlq.t."
    assert check_topic("g", "t", True, True, False, "dlq.") == ("Configured DLQ topic name does not comply with "
                                                                "the DLQ topic prefix in share group: g, topic: t, "
                                                                "prefix: dlq..")  # Kafka's format ends with "."
    assert check_topic("g", "t", True, True, False, "") is None
    assert check_topic("g", "dlq.t", False, False, True, "dlq.") is None


def test_dead_letters_carry_kafkas_headers_and_are_found_by_them():
    letters = [(3, 1, DEAD_LETTER_REJECTED), (9, 5, DEAD_LETTER_EXHAUSTED)]
    # The source's own headers come first, so a header of its that looks like Kafka's (a dead
    # letter of a dead letter) is overridden by the one the broker adds after it.
    source = (b"k", b"v", (("h", b"x"), ("__dlq.errors.group", b"forged")))
    batch, included = build_dead_letters(letters, {3: source}, "g", "t", 2, 1_000, 1 << 20)
    assert included == [3, 9]
    records = list(iter_records(batch))
    assert [(r.key, r.value, r.timestamp) for r in records] == [(b"k", b"v", 1_000), (None, None, 1_000)]
    assert records[0].headers[:2] == source[2] and len(records[1].headers) == 6
    assert dict(records[1].headers) == {
        "__dlq.errors.topic": b"t", "__dlq.errors.partition": b"2", "__dlq.errors.offset": b"9",
        "__dlq.errors.group": b"g", "__dlq.errors.delivery.count": b"5",
        "__dlq.errors.message": DELIVERY_COUNT_EXCEEDED.encode()}
    assert dict(records[0].headers)["__dlq.errors.message"] == CLIENT_REJECT.encode()
    # The search reads a group's own dead letters of one partition, in log order, in a range.
    other = build_dead_letters([(4, 1, DEAD_LETTER_REJECTED)], {}, "other", "t", 2, 1_000, 1 << 20)[0]
    data = batch + _at(other, 2)
    assert own_dead_letters(data, 0, 10, "g", "t", 2) == ([3, 9], 3)
    assert own_dead_letters(data, 1, 10, "g", "t", 2) == ([9], 3)
    assert own_dead_letters(data, 0, 10, "g", "t", 1) == ([], 3)
    # A batch holds what fits, at least one.
    big = {o: (None, b"x" * 600, ()) for o in range(10)}
    _, some = build_dead_letters([(o, 1, DEAD_LETTER_REJECTED) for o in range(10)], big, "g", "t", 0, 0, 2_000)
    assert some == [0, 1]
    _, one = build_dead_letters([(0, 1, DEAD_LETTER_REJECTED)], big, "g", "t", 0, 0, 10)
    assert one == [0]


def test_source_records_are_read_by_offset():
    data = build_batch([Record(10, 5, b"a", b"1", ()), Record(11, 5, None, b"2", (("h", None),))],
                       base_offset=10, timestamp=5)
    assert source_records(data, {11, 30}) == ({11: (None, b"2", (("h", None),))}, 12)


def _at(batch: bytes, base_offset: int) -> bytes:
    """`batch` moved to `base_offset` (as the log assigns it)."""
    records = [Record(base_offset + r.offset, r.timestamp, r.key, r.value, r.headers) for r in iter_records(batch)]
    return build_batch(records, base_offset=base_offset, timestamp=records[0].timestamp)


def test_the_search_stops_at_the_first_own_dead_letter_not_pending(monkeypatch):
    """The backward search over a dead-letter partition (fetches stubbed, in small steps): the
    pending offsets written are found, another group's letters and other partitions' are passed
    over, and an own letter that is not pending ends it (everything older was archived)."""
    import asyncio
    from types import SimpleNamespace

    from strom.share import dead_letters as dl

    log = [("g", 0, 1), ("g", 0, 2), ("other", 0, 5), ("g", 1, 5), ("g", 0, 5), ("g", 0, 7), ("other", 0, 9)]
    batches = [_at(build_dead_letters([(src, 1, DEAD_LETTER_REJECTED)], {}, group, "t", part, 0, 1 << 20)[0], i)
               for i, (group, part, src) in enumerate(log)]
    fetched: list[int] = []

    async def fetch(leader, epoch, topic, partition, offset):
        fetched.append(offset)
        return SimpleNamespace(records=b"".join(batches[offset:offset + 2]))

    async def settled(topic, partition):
        return 1, 0, 0, len(log)

    writer = dl.DeadLetterWriter(SimpleNamespace(), {}, lambda key: None)
    monkeypatch.setattr(dl, "_SCAN_FIRST", 2)
    monkeypatch.setattr(writer, "_fetch", fetch)
    monkeypatch.setattr(writer, "_settled", settled)
    found = asyncio.run(writer._search("dlq", 0, "g", "t", 0, {2, 5, 7, 9}))
    assert found == {2, 5, 7}  # 9 was never written: it is not there
    fetched.clear()
    found = asyncio.run(writer._search("dlq", 0, "g", "t", 0, {5, 7, 9}))
    assert found == {5, 7}  # own letter 2 is not pending: the search ends there,
    assert fetched == [5, 1, 3]  # newest step first, and offset 0 is never read
