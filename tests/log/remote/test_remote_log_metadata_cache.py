"""RemoteLogMetadataCache: one partition's remote segments from its metadata records, in
order. Which segment serves an offset, what is listed, what is left to clean, and the records
the states refuse."""

from __future__ import annotations

import uuid

import pytest

from strom.log.remote import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
)
from strom.log.remote.metadata_cache import (
    RemoteLogMetadataCache,
    RemoteLogMetadataStateError,
    is_valid_transition,
    is_within_lineage,
)
from strom.log.remote.records import deserialize, serialize

S = RemoteLogSegmentState
TOPIC_ID = uuid.uuid4()


def started(start: int, end: int, epochs: tuple[tuple[int, int], ...]) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(TOPIC_ID, "t", 0), start_offset=start, end_offset=end,
        max_timestamp_ms=end, broker_id=1, event_timestamp_ms=0, segment_leader_epochs=epochs,
        size_bytes=1000)


def update(metadata: RemoteLogSegmentMetadata, state: RemoteLogSegmentState, custom: bytes | None = None,
           broker: int = 1) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(metadata.segment_id, 1, state, broker, custom)


def copied(cache: RemoteLogMetadataCache, start: int, end: int, epochs) -> RemoteLogSegmentMetadata:
    metadata = started(start, end, epochs)
    cache.apply(metadata)
    cache.apply(update(metadata, S.COPY_SEGMENT_FINISHED))
    return metadata


def ids(segments) -> list[uuid.UUID]:
    return [s.segment_id.id for s in segments]


def test_legal_path_through_the_states():
    cache = RemoteLogMetadataCache()
    seg = started(0, 99, ((0, 0),))
    cache.apply(seg)
    assert cache.segment(seg.segment_id).state is S.COPY_SEGMENT_STARTED
    for state in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED):
        cache.apply(update(seg, state))
        assert cache.segment(seg.segment_id).state is state
    cache.apply(update(seg, S.DELETE_SEGMENT_FINISHED))
    assert cache.segment(seg.segment_id) is None
    assert cache.all_segments() == [] and cache.segments_for_epoch(0) == []


def test_transition_table():
    assert is_valid_transition(None, S.COPY_SEGMENT_STARTED)
    assert is_valid_transition(S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED)  # cleaning an orphan
    assert is_valid_transition(S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED)  # a retried record
    assert not is_valid_transition(None, S.COPY_SEGMENT_FINISHED)
    assert not is_valid_transition(S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)
    assert not is_valid_transition(S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_STARTED)
    assert not is_valid_transition(S.DELETE_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED)


STARTED, FINISHED, DELETING = S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED


@pytest.mark.parametrize(("path", "illegal"), [
    ((), FINISHED),  # no metadata record: an unknown segment
    ((STARTED,), S.DELETE_SEGMENT_FINISHED),
    ((STARTED, FINISHED), STARTED),
    ((STARTED, FINISHED, DELETING), FINISHED),
    ((STARTED, FINISHED, DELETING, S.DELETE_SEGMENT_FINISHED), DELETING),  # gone
])
def test_illegal_transition_raises_and_changes_nothing(path, illegal):
    cache = RemoteLogMetadataCache()
    seg = started(0, 99, ((0, 0),))
    for state in path:
        cache.apply(seg if state is STARTED else update(seg, state))
    before = (cache.all_segments(), cache.segments_for_epoch(0), cache.segment_for(0, 5))
    with pytest.raises(RemoteLogMetadataStateError):
        cache.apply(update(seg, illegal))
    assert (cache.all_segments(), cache.segments_for_epoch(0), cache.segment_for(0, 5)) == before


def test_metadata_record_must_start_a_copy():
    cache = RemoteLogMetadataCache()
    seg = started(0, 99, ((0, 0),))
    with pytest.raises(RemoteLogMetadataStateError, match="COPY_SEGMENT_STARTED"):
        cache.apply(seg.with_state(S.COPY_SEGMENT_FINISHED, 1))
    cache.apply(seg)
    cache.apply(update(seg, S.COPY_SEGMENT_FINISHED))
    with pytest.raises(RemoteLogMetadataStateError, match="cannot go from COPY_SEGMENT_FINISHED"):
        cache.apply(seg)  # the same segment started again


def test_segment_for_finds_the_finished_segment_holding_the_offset():
    cache = RemoteLogMetadataCache()
    a = copied(cache, 0, 99, ((0, 0),))
    b = copied(cache, 100, 199, ((0, 100), (1, 150)))
    c = copied(cache, 200, 299, ((1, 200),))
    assert cache.segment_for(0, 0) == cache.segment(a.segment_id)
    assert cache.segment_for(0, 99).segment_id == a.segment_id
    assert cache.segment_for(0, 120).segment_id == b.segment_id
    assert cache.segment_for(0, 150) is None  # offset 150 is epoch 1's
    assert cache.segment_for(1, 150).segment_id == b.segment_id
    assert cache.segment_for(1, 299).segment_id == c.segment_id
    assert cache.segment_for(1, 300) is None  # past what is copied
    assert cache.segment_for(1, 149) is None  # before the epoch's first segment
    assert cache.segment_for(2, 250) is None  # an epoch with nothing copied


def test_segments_for_epoch_and_highest_offset():
    cache = RemoteLogMetadataCache()
    a = copied(cache, 0, 99, ((0, 0),))
    b = copied(cache, 100, 199, ((0, 100), (1, 150)))
    c = started(200, 299, ((1, 200),))
    cache.apply(c)
    assert ids(cache.segments_for_epoch(0)) == ids([a, b])
    assert ids(cache.segments_for_epoch(1)) == ids([b, c])  # the copy in progress is listed
    assert cache.highest_offset_for_epoch(0) == 149
    assert cache.highest_offset_for_epoch(1) == 199  # c is not finished
    assert cache.highest_offset_for_epoch(2) is None
    assert ids(cache.all_segments()) == ids([a, b, c])
    cache.apply(update(a, S.DELETE_SEGMENT_STARTED))
    assert cache.segment_for(0, 50) is None  # being deleted: listed, not served
    assert ids(cache.segments_for_epoch(0)) == ids([a, b])
    cache.apply(update(a, S.DELETE_SEGMENT_FINISHED))
    assert ids(cache.segments_for_epoch(0)) == ids([b])
    assert cache.highest_offset_for_epoch(0) == 149  # what was copied stays copied


def test_interrupted_copy_is_an_orphan_never_served():
    cache = RemoteLogMetadataCache()
    a = copied(cache, 0, 99, ((0, 0),))
    orphan = started(100, 199, ((0, 100),))  # the leader died before COPY_SEGMENT_FINISHED
    cache.apply(orphan)
    assert cache.segment_for(0, 150) is None
    assert cache.segment_for(0, 99).segment_id == a.segment_id
    assert ids(cache.unreferenced_segments()) == ids([orphan])
    assert cache.highest_offset_for_epoch(0) == 99  # the next leader copies from 100 again
    # the next leader copies the same offsets under a new id; the orphan is cleaned
    retry = copied(cache, 100, 199, ((0, 100),))
    assert cache.segment_for(0, 150).segment_id == retry.segment_id
    cache.apply(update(orphan, S.DELETE_SEGMENT_STARTED))
    assert ids(cache.unreferenced_segments()) == ids([orphan])
    cache.apply(update(orphan, S.DELETE_SEGMENT_FINISHED))
    assert cache.unreferenced_segments() == []
    assert cache.segment_for(0, 150).segment_id == retry.segment_id


def test_a_later_copy_of_the_same_offsets_replaces_the_earlier():
    # the old leader copied 0-100; a new one, behind on copying, copies 0-200 for the same epoch
    cache = RemoteLogMetadataCache()
    old = copied(cache, 0, 100, ((0, 0),))
    new = copied(cache, 0, 200, ((0, 0),))
    assert cache.segment_for(0, 50).segment_id == new.segment_id
    assert ids(cache.unreferenced_segments()) == ids([old])
    assert set(ids(cache.segments_for_epoch(0))) == {old.segment_id.id, new.segment_id.id}  # both listed
    assert cache.highest_offset_for_epoch(0) == 200


def test_overlapping_copy_serves_from_the_newer():
    cache = RemoteLogMetadataCache()
    copied(cache, 10, 90, ((0, 10),))
    s1 = copied(cache, 5, 100, ((0, 5),))
    s2 = copied(cache, 101, 200, ((0, 101),))
    assert cache.segment_for(0, 95).segment_id == s1.segment_id
    assert cache.segment_for(0, 150).segment_id == s2.segment_id


def test_segment_outside_the_leaders_lineage_is_not_served():
    # Leader A (epochs 1, then 2 from offset 150) copied 100-199. An unclean election made B
    # leader in epoch 3 with a log ending at 149: A's epoch 2 records are gone from the partition.
    cache = RemoteLogMetadataCache()
    abandoned = copied(cache, 100, 199, ((1, 100), (2, 150)))
    lineage = [(0, 0), (1, 100), (3, 150)]
    assert cache.segment_for(1, 120).segment_id == abandoned.segment_id  # without the lineage
    assert cache.segment_for(1, 120, lineage) is None
    assert cache.segment_for(2, 160, lineage) is None
    assert not is_within_lineage(abandoned, lineage)
    # B copies its own epoch 1-3 data; that is served
    ours = copied(cache, 100, 179, ((1, 100), (3, 150)))
    assert cache.segment_for(1, 120, lineage).segment_id == ours.segment_id
    assert cache.segment_for(3, 170, lineage, log_end_offset=400).segment_id == ours.segment_id
    assert cache.segment_for(3, 170, lineage, log_end_offset=170) is None  # past the log's end


AFTER_RETENTION = [(7, 51), (9, 100)]  # Kafka's example lineage once offsets below 51 are gone


@pytest.mark.parametrize(("lineage", "epochs", "end", "within"), [
    ([(5, 10), (7, 15), (9, 100)], ((5, 10), (7, 15)), 50, True),
    (AFTER_RETENTION, ((5, 14), (7, 15), (9, 100)), 150, True),  # epoch 5 is before the lineage
    (AFTER_RETENTION, ((7, 51), (9, 100)), 150, True),
    (AFTER_RETENTION, ((7, 40), (9, 100)), 150, True),  # epoch 7 is the lineage's first: any start
    (AFTER_RETENTION, ((9, 90),), 150, False),  # epoch 9 began at 100 in the leader's log
    (AFTER_RETENTION, ((7, 60), (8, 80)), 90, False),  # epoch 8 is not in the lineage
    (AFTER_RETENTION, ((7, 60),), 120, False),  # runs into epoch 9
    (AFTER_RETENTION, ((11, 300),), 350, False),  # later than the lineage's last epoch
    (AFTER_RETENTION, ((7, 60), (9, 110)), 150, False),  # epoch 9 started elsewhere in the segment
])
def test_is_within_lineage(lineage, epochs, end, within):
    metadata = started(epochs[0][1], end, epochs)
    assert is_within_lineage(metadata, lineage) is within


def test_epochs_without_records_are_ignored_in_the_lineage():
    # the leader's epoch 8 started at 100 and held nothing before epoch 9 started at 100
    metadata = started(60, 150, ((7, 60), (9, 100)))
    assert is_within_lineage(metadata, [(7, 51), (8, 100), (9, 100)])


def test_custom_metadata_follows_the_updates():
    cache = RemoteLogMetadataCache()
    seg = started(0, 99, ((0, 0),))
    cache.apply(seg)
    cache.apply(update(seg, S.COPY_SEGMENT_FINISHED, custom=b"bucket-7", broker=4))
    assert cache.custom_metadata(seg.segment_id) == b"bucket-7"
    assert cache.segment(seg.segment_id).broker_id == 4
    cache.apply(update(seg, S.DELETE_SEGMENT_STARTED))
    assert cache.custom_metadata(seg.segment_id) is None


def test_partition_deletion_states():
    cache = RemoteLogMetadataCache()

    def delete(state: RemotePartitionDeleteState) -> RemotePartitionDeleteMetadata:
        return RemotePartitionDeleteMetadata(TOPIC_ID, "t", 0, state, 0, 0)

    with pytest.raises(RemoteLogMetadataStateError):
        cache.apply(delete(RemotePartitionDeleteState.DELETE_PARTITION_STARTED))
    for state in RemotePartitionDeleteState:
        cache.apply(delete(state))
        cache.apply(delete(state))  # repeated by a writer that failed over
        assert cache.partition_delete_state is state
    with pytest.raises(RemoteLogMetadataStateError):
        cache.apply(delete(RemotePartitionDeleteState.DELETE_PARTITION_MARKED))


def test_built_from_record_values_in_order():
    cache = RemoteLogMetadataCache()
    a, orphan = started(0, 99, ((0, 0),)), started(100, 199, ((0, 100),))
    values = [serialize(a), serialize(update(a, S.COPY_SEGMENT_FINISHED)), serialize(orphan)]
    for value in values:
        cache.apply(deserialize(value))
    assert cache.segment_for(0, 42).segment_id == a.segment_id
    assert ids(cache.unreferenced_segments()) == ids([orphan])
