"""SharePartition, the KIP-932 state machine of one share group on one partition, and the
form its state takes in `__share_group_state`: in-process, with times given."""

from __future__ import annotations

import uuid

from strom.coordinator.share.share_partition import (
    ACCEPT,
    ACKNOWLEDGE_TYPES_V2,
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    Acquired,
    LogBatch,
    SharePartition,
    ShareState,
    StateBatch,
    valid_acknowledgements,
)
from strom.coordinator.share.state_store import (
    SharePartitionKey,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from strom.protocol.errors import ErrorCode
from strom.protocol.records import Record, build_batch, read_header
from strom.share.delayed_delivery import NOT_BEFORE_HEADER, batch_not_before, parse_not_before

LOCK = 1000


def sp(start: int = 0, limit: int = 3, max_in_flight: int = 100, state: ShareState | None = None) -> SharePartition:
    return SharePartition(start, delivery_limit=limit, max_in_flight=max_in_flight, state=state)


def batches(*ranges: tuple[int, int]) -> list[LogBatch]:
    return [LogBatch(a, b) for a, b in ranges]


def test_new_batches_are_acquired_whole_and_once():
    p = sp()
    assert p.acquire("m1", batches((0, 4), (5, 9)), max_records=3, now_ms=0, lock_ms=LOCK) == [Acquired(0, 4, 1)]
    assert p.end_offset == 5
    # What m1 holds is not available to m2: it gets the next batch.
    assert p.acquire("m2", batches((0, 4), (5, 9)), 100, 0, LOCK) == [Acquired(5, 9, 1)]
    assert p.fetch_offset() == 10


def test_accept_and_reject_move_the_start_offset_release_redelivers():
    p = sp()
    p.acquire("m", batches((0, 4)), 100, 0, LOCK)
    assert p.acknowledge("m", [(0, 1, [ACCEPT]), (2, 2, [REJECT]), (3, 4, [RELEASE, GAP])]) == ErrorCode.NONE
    assert p.start_offset == 3  # 0-2 done; 3 is available again, 4 (a gap) archived
    assert p.records[3].state == AVAILABLE and p.records[4].state == ARCHIVED
    assert p.fetch_offset() == 3
    assert p.acquire("m", batches((0, 4)), 100, 0, LOCK) == [Acquired(3, 3, 2)]


def test_acknowledgements_are_checked_whole():
    p = sp()
    p.acquire("m", batches((0, 4)), 100, 0, LOCK)
    assert p.acknowledge("other", [(0, 0, [ACCEPT])]) == ErrorCode.INVALID_RECORD_STATE
    assert p.acknowledge("m", [(0, 1, [ACCEPT]), (7, 7, [ACCEPT])]) == ErrorCode.INVALID_RECORD_STATE
    assert p.acknowledge("m", [(0, 2, [ACCEPT, ACCEPT])]) == ErrorCode.INVALID_REQUEST  # neither 1 nor 3 types
    assert p.acknowledge("m", [(0, 0, [9])]) == ErrorCode.INVALID_REQUEST
    assert p.start_offset == 0 and p.acquired_count() == 5  # nothing applied


def test_acknowledgement_batches_must_be_ordered_apart_and_well_formed():
    assert valid_acknowledgements([(0, 4, [ACCEPT]), (5, 6, [RELEASE, GAP]), (9, 9, [REJECT])])
    assert not valid_acknowledgements([(0, 4, [ACCEPT])] * 2)  # repeated
    assert not valid_acknowledgements([(0, 4, [ACCEPT]), (4, 6, [ACCEPT])])  # overlapping
    assert not valid_acknowledgements([(5, 6, [ACCEPT]), (0, 4, [ACCEPT])])  # out of order
    assert not valid_acknowledgements([(4, 3, [ACCEPT])])
    assert not valid_acknowledgements([(0, 1, [])])
    assert not valid_acknowledgements([(0, 2, [ACCEPT, ACCEPT])])
    assert not valid_acknowledgements([(0, 0, [4])])  # RENEW is not one of v1's types
    assert not valid_acknowledgements([(-2, 0, [ACCEPT])])
    # What a member holds bounds the walk, not what a batch claims.
    p = sp()
    p.acquire("m", batches((0, 4)), 100, 0, LOCK)
    assert p.acknowledge("m", [(0, 2**62, [ACCEPT])]) == ErrorCode.INVALID_RECORD_STATE


def test_delivery_limit_archives():
    p = sp(limit=2)
    for count in (1, 2):
        assert p.acquire("m", batches((0, 0)), 100, 0, LOCK) == [Acquired(0, 0, count)]
        p.acknowledge("m", [(0, 0, [RELEASE])])
    assert p.start_offset == 1 and not p.records  # archived after the second delivery


def test_a_restored_record_at_its_delivery_limit_is_archived_not_delivered_again():
    """State read back after a failover may hold a record AVAILABLE whose delivery count already
    reached group.share.delivery.count.limit (its last delivery's lock was cut short by the
    failover): it is archived at the next acquisition, never delivered a time too many."""
    state = ShareState(0, [StateBatch(0, 0, AVAILABLE, 2), StateBatch(1, 1, AVAILABLE, 1)])
    p = sp(limit=2, state=state)
    assert p.acquire("m", batches((0, 1)), 100, 0, LOCK) == [Acquired(1, 1, 2)]
    assert p.start_offset == 1 and 0 not in p.records  # archived, so done with


def test_a_lowered_delivery_limit_allows_one_final_delivery_then_archives():
    """KIP-1240: the limit is checked when a delivery completes. A record AVAILABLE after two
    deliveries under limit 5 gets a third once the group lowers it to 2, and is archived when
    that one completes; one ACQUIRED when it is lowered is archived at its release."""
    p = sp(limit=5)
    for count in (1, 2):
        assert p.acquire("m", batches((0, 1)), 100, 0, LOCK) == [Acquired(0, 1, count)]
        p.acknowledge("m", [(0, 1, [RELEASE])])
    assert p.acquire("m", batches((1, 1)), 100, 0, LOCK) == [Acquired(1, 1, 3)]
    p.delivery_limit = 2
    p.acknowledge("m", [(1, 1, [RELEASE])])  # delivered 3 times, over the new limit: done
    assert p.records[1].state == ARCHIVED
    assert p.acquire("m", batches((0, 1)), 100, 0, LOCK) == [Acquired(0, 0, 3)]  # the final delivery
    assert p.expire_locks(LOCK)
    assert p.start_offset == 2 and not p.records  # archived once it completed
    q = sp(limit=2)
    q.acquire("m", batches((0, 0)), 100, 0, LOCK)
    q.acknowledge("m", [(0, 0, [RELEASE])])
    q.delivery_limit = 4  # raised: what is not archived yet is delivered again
    assert q.acquire("m", batches((0, 0)), 100, 0, LOCK) == [Acquired(0, 0, 2)]


def test_a_lowered_in_flight_bound_stops_new_acquisitions_until_the_window_drains():
    """KIP-1240's share.partition.max.record.locks set lower than what is in flight: records
    AVAILABLE in the window are still delivered again, new ones wait until it drains below."""
    p = sp(max_in_flight=10)
    assert p.acquire("m", batches((0, 1), (2, 3), (4, 5)), 100, 0, LOCK) == [Acquired(0, 5, 1)]
    p.max_in_flight = 4
    p.acknowledge("m", [(0, 0, [RELEASE])])
    assert p.fetch_offset() == 0
    assert p.acquire("n", batches((0, 1), (6, 7)), 100, 0, LOCK) == [Acquired(0, 0, 2)]  # not 6-7
    assert p.fetch_offset() is None
    p.acknowledge("m", [(1, 2, [ACCEPT])])
    assert p.fetch_offset() is None  # 3 to 5 and 0 still in flight: 6 offsets in the window
    p.acknowledge("n", [(0, 0, [ACCEPT])])
    p.acknowledge("m", [(3, 3, [ACCEPT])])
    assert p.in_flight == 2 and p.fetch_offset() == 6
    assert p.acquire("n", batches((6, 7), (8, 9), (10, 11)), 100, 0, LOCK) == [Acquired(6, 7, 1)]
    assert p.in_flight == 4 and p.fetch_offset() is None  # at the bound again


def test_lock_expiry_makes_records_available_with_their_count():
    p = sp()
    p.acquire("m", batches((0, 1)), 100, now_ms=0, lock_ms=LOCK)
    assert not p.expire_locks(999)
    assert p.expire_locks(1000)
    assert p.acquire("n", batches((0, 1)), 100, 1000, LOCK) == [Acquired(0, 1, 2)]
    assert p.acknowledge("m", [(0, 0, [ACCEPT])]) == ErrorCode.INVALID_RECORD_STATE  # m lost them


def test_window_is_bounded_by_max_in_flight():
    p = sp(max_in_flight=4)
    assert p.acquire("m", batches((0, 2), (3, 5), (6, 8)), 100, 0, LOCK) == [Acquired(0, 5, 1)]
    assert p.fetch_offset() is None  # full: 6 in flight, nothing available
    p.acknowledge("m", [(0, 5, [ACCEPT])])
    assert p.fetch_offset() == 6


def test_control_batches_and_missing_offsets_are_never_delivered():
    p = sp()
    got = p.acquire("m", [LogBatch(0, 1), LogBatch(2, 2, skip=True), LogBatch(5, 6)], 100, 0, LOCK)
    assert got == [Acquired(0, 1, 1), Acquired(5, 6, 1)]
    assert [p.records[o].state for o in (2, 3, 4)] == [ARCHIVED] * 3


def test_release_member_and_state_round_trip():
    p = sp(start=10)
    p.acquire("m", batches((10, 14)), 100, 0, LOCK)
    p.acknowledge("m", [(11, 11, [ACCEPT]), (12, 12, [REJECT])])
    state = p.state()  # acquired records are kept as available with their delivery count
    assert state == ShareState(10, [StateBatch(10, 10, AVAILABLE, 1), StateBatch(11, 11, ACKNOWLEDGED, 1),
                                    StateBatch(12, 12, ARCHIVED, 1), StateBatch(13, 14, AVAILABLE, 1)])
    assert decode_value(encode_value(state)) == state
    restored = sp(state=decode_value(encode_value(state)))
    assert restored.acquire("n", batches((10, 14)), 100, 0, LOCK) == [Acquired(10, 10, 2), Acquired(13, 14, 2)]
    assert p.release_member("m") and p.acquired_count() == 0
    key = SharePartitionKey("g", uuid.uuid4(), 3)
    assert decode_key(encode_key(key)) == key


def test_move_start_and_reset():
    p = sp()
    p.acquire("m", batches((0, 9)), 100, 0, LOCK)
    p.move_start(4)
    assert p.start_offset == 4 and min(p.records) == 4
    p.reset(100)
    assert (p.start_offset, p.end_offset, p.records, p.state_epoch) == (100, 100, {}, 1)


def test_renew_locks_held_records_again_and_is_not_persisted():
    p = sp()
    p.acquire("m", batches((0, 4)), 100, 0, LOCK)
    p.dirty = False
    assert p.acknowledge("m", [(0, 4, [RENEW])], now_ms=900, lock_ms=LOCK) == ErrorCode.INVALID_REQUEST  # v1
    assert p.acknowledge("other", [(0, 4, [RENEW])], 900, LOCK, ACKNOWLEDGE_TYPES_V2) == ErrorCode.INVALID_RECORD_STATE
    assert p.acknowledge("m", [(0, 2, [RENEW]), (3, 4, [RENEW, ACCEPT])], 900, LOCK,
                         ACKNOWLEDGE_TYPES_V2) == ErrorCode.NONE
    assert not p.expire_locks(1500)  # the first lock ran out at 1000; renewed until 1900
    assert p.acquired_count() == 4 and p.records[4].state == ACKNOWLEDGED
    assert p.expire_locks(1900) and p.acquired_count() == 0
    assert [(r.state, r.delivery_count) for r in (p.records[o] for o in range(4))] == [(AVAILABLE, 1)] * 4


def test_record_limit_takes_part_of_a_batch():
    p = sp()
    assert p.acquire("m1", batches((0, 9)), 3, 0, LOCK, record_limit=True) == [Acquired(0, 2, 1)]
    assert p.end_offset == 3  # the rest of the batch was never delivered
    assert p.acquire("m2", batches((0, 9)), 3, 0, LOCK, record_limit=True) == [Acquired(3, 5, 1)]
    assert p.acknowledge("m1", [(0, 2, [RELEASE])]) == ErrorCode.NONE
    # Released records first, then new ones, never more than asked for.
    assert p.acquire("m2", batches((0, 9)), 5, 0, LOCK, record_limit=True) == [Acquired(0, 2, 2), Acquired(6, 7, 1)]
    assert p.acquire("m1", batches((0, 9)), 100, 0, LOCK) == [Acquired(8, 9, 1)]


def test_only_durable_changes_make_the_partition_dirty():
    """As in Kafka, an acquisition is not written: a crash gives it back with the count of the
    last write. Acknowledgements, lock expiries and archives are."""
    p = sp()
    assert p.acquire("m", [LogBatch(0, 4)], 10, 0, LOCK) == [Acquired(0, 4, 1)]
    assert not p.dirty
    assert p.acknowledge("m", [(0, 1, [ACCEPT])]) == ErrorCode.NONE
    assert p.dirty
    p.dirty = False
    assert p.expire_locks(LOCK)  # 2-4 available again, their count kept
    assert p.dirty and p.state().batches == [StateBatch(2, 4, AVAILABLE, 1)]
    p.dirty = False
    assert p.acquire("m", [LogBatch(2, 4), LogBatch(5, 5, skip=True)], 10, LOCK, LOCK) == [Acquired(2, 4, 2)]
    assert p.dirty  # the control batch at 5 was archived


# --- delayed delivery (a Strom extension) ----------------------------------------------------
def test_records_not_yet_due_are_left_available_and_acquired_once_due():
    p = sp()
    # Offset 1 carries a not-before of 5000; 0 and 2 do not, nor does the batch after.
    log = [LogBatch(0, 2, not_before={1: 5000}), LogBatch(3, 4)]
    assert p.acquire("m", log, 100, now_ms=1000, lock_ms=LOCK) == [Acquired(0, 0, 1), Acquired(2, 4, 1)]
    assert p.records[1].state == AVAILABLE and p.records[1].delivery_count == 0
    assert p.next_due(1000) == 5000
    assert p.fetch_offset(4999) == 5  # nothing due in the window: read past it
    assert p.acquire("m2", [LogBatch(0, 2), LogBatch(3, 4)], 100, 4999, LOCK) == []
    assert p.fetch_offset(5000) == 1
    # Its not-before is kept in memory: the batch read again needs no header.
    assert not p.needs_headers(0, 2) and p.needs_headers(3, 5)
    assert p.acquire("m2", [LogBatch(0, 2)], 100, 5000, LOCK) == [Acquired(1, 1, 1)]
    assert p.next_due(5000) is None
    # A past not-before is no delay; the persisted state does not know of any.
    q = sp()
    assert q.acquire("m", [LogBatch(0, 1, not_before={0: 10})], 100, 1000, LOCK) == [Acquired(0, 1, 1)]


def test_a_release_with_a_delay_waits_and_the_limit_still_archives():
    p = sp(limit=2)
    p.acquire("m", batches((0, 1)), 100, 0, LOCK)
    assert p.acknowledge("m", [(0, 1, [RELEASE])], now_ms=100, release_delay_ms=1000) == ErrorCode.NONE
    assert p.next_due(100) == 1100 and p.fetch_offset(1099) == 2
    assert p.acquire("m", batches((0, 1)), 100, 1099, LOCK) == []
    assert p.acquire("m", batches((0, 1)), 100, 1100, LOCK) == [Acquired(0, 1, 2)]
    # At the delivery limit a release archives: nothing waits.
    assert p.acknowledge("m", [(0, 1, [RELEASE])], now_ms=1200, release_delay_ms=1000) == ErrorCode.NONE
    assert p.start_offset == 2 and p.next_due(1200) is None


def test_not_before_times_are_persisted_and_restored_exactly():
    p = sp()
    p.acquire("m", [LogBatch(0, 2), LogBatch(3, 4, not_before={4: 9000})], 100, 0, LOCK)
    assert p.acknowledge("m", [(0, 0, [RELEASE]), (1, 1, [ACCEPT])], now_ms=1000, release_delay_ms=2000) == 0
    p.acknowledge("m", [(2, 2, [RELEASE])], now_ms=1500)  # no delay
    state = p.state()
    # A not-before is kept for AVAILABLE records only (an acquired one has none to keep).
    assert state.batches == [StateBatch(0, 0, AVAILABLE, 1, 3000), StateBatch(1, 1, ACKNOWLEDGED, 1),
                             StateBatch(2, 3, AVAILABLE, 1), StateBatch(4, 4, AVAILABLE, 0, 9000)]
    assert decode_value(encode_value(state)) == state  # value v2 carries them
    restored = sp(state=decode_value(encode_value(state)))
    # The released record waits its own delay, no more; the never-delivered one its header's
    # time (its header need not be read again); the others are available at once.
    assert not restored.needs_headers(4, 4)
    assert restored.next_due(1500) == 3000
    assert restored.acquire("m", [LogBatch(0, 2), LogBatch(3, 4)], 100, 1500, LOCK) == [
        Acquired(2, 3, 2)]
    assert restored.acquire("m", [LogBatch(0, 2), LogBatch(3, 4)], 100, 3000, LOCK) == [Acquired(0, 0, 2)]
    assert restored.acquire("m", [LogBatch(3, 4)], 100, 9000, LOCK) == [Acquired(4, 4, 1)]


def test_a_restored_window_reads_headers_of_never_delivered_records_again():
    state = ShareState(0, [StateBatch(0, 1, AVAILABLE, 1), StateBatch(2, 3, AVAILABLE, 0),
                           StateBatch(4, 4, ACKNOWLEDGED, 1)])
    p = sp(state=state)
    assert p.needs_headers(2, 3) and not p.needs_headers(0, 1)
    log = [LogBatch(0, 1), LogBatch(2, 3, not_before={3: 2500})]
    assert p.acquire("m", log, 100, 2000, LOCK) == [Acquired(0, 1, 2), Acquired(2, 2, 1)]
    assert not p.needs_headers(2, 3)
    assert p.next_due(2000) == 2500
    assert p.acquire("m", log, 100, 2500, LOCK) == [Acquired(3, 3, 1)]
    # Old values (v1, no not-before) still read.
    assert decode_value(encode_value(state)) == state and encode_value(state)[:2] == b"\x00\x01"


def test_not_before_headers_are_read_only_from_batches_that_hold_one():
    def rec(offset: int, value: bytes, *headers: tuple[str, bytes]) -> Record:
        return Record(offset, 0, None, value, headers)


    assert parse_not_before(b"1767225600000") == 1767225600000
    assert parse_not_before(b"-5") is None and parse_not_before(b"9" * 40) is None and parse_not_before(None) is None
    for codec in (0, 1, 3):  # none, gzip, lz4
        plain = build_batch([rec(7, b"v")], base_offset=7, codec=codec)
        assert batch_not_before(plain, 0, read_header(plain)) is None
        marked = build_batch([rec(7, b"a"), rec(8, b"b", (NOT_BEFORE_HEADER, b"1234")),
                              rec(9, b"c", (NOT_BEFORE_HEADER, b"soon"))], base_offset=7, codec=codec)
        assert batch_not_before(marked, 0, read_header(marked)) == {8: 1234}
