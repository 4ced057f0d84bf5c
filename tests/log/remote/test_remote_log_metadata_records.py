"""`__remote_log_metadata` record values: the wire codec against bytes laid out by hand from
Kafka's schemas, round trips through the log's shapes, and input that must be refused."""

from __future__ import annotations

import struct
import uuid

import pytest

from strom.log.remote import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState
from strom.log.remote.records import (
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    deserialize,
    serialize,
)
from strom.protocol import remote_log_metadata as wire
from strom.protocol.remote_log_metadata import RemoteLogMetadataError

TOPIC_ID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
SEGMENT = uuid.UUID("0f0e0d0c-0b0a-0908-0706-050403020100")


def i8(n: int) -> bytes:
    return struct.pack(">b", n)


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def i64(n: int) -> bytes:
    return struct.pack(">q", n)


# RemoteLogSegmentMetadataRecord v0 for topic "t", partition 3, offsets 100-199, epochs
# {5: 100, 7: 150}, custom metadata b"ab", state COPY_SEGMENT_FINISHED, laid out field by field.
SEGMENT_RECORD = b"".join([
    b"\x01",              # frame version 1 (unsigned varint)
    b"\x00",              # api key 0: RemoteLogSegmentMetadataRecord
    b"\x00",              # version 0
    # RemoteLogSegmentId
    #   TopicIdPartition
    b"\x02" b"t",         #     Name: compact string (length + 1 = 2)
    TOPIC_ID.bytes,       #     Id: uuid, 16 bytes
    i32(3),               #     Partition: int32
    b"\x00",              #     tagged fields: none
    SEGMENT.bytes,        #   Id: uuid
    b"\x00",              #   tagged fields: none
    i64(100),             # StartOffset
    i64(199),             # EndOffset
    i32(1),               # BrokerId
    i64(1_700_000_000_123),  # MaxTimestampMs
    i64(1_700_000_000_456),  # EventTimestampMs
    b"\x03",              # SegmentLeaderEpochs: compact array of 2 (2 + 1)
    i32(5), i64(100), b"\x00",  # LeaderEpoch, Offset, tagged fields
    i32(7), i64(150), b"\x00",
    i32(4096),            # SegmentSizeInBytes
    b"\x03" b"ab",        # CustomMetadata: compact nullable bytes (length + 1 = 3)
    i8(1),                # RemoteLogSegmentState: COPY_SEGMENT_FINISHED
    b"\x00",              # the record's tagged fields: none
])

UPDATE_RECORD = b"".join([
    b"\x01", b"\x01", b"\x00",  # frame version 1, api key 1, version 0
    b"\x02" b"t", TOPIC_ID.bytes, i32(3), b"\x00",  # RemoteLogSegmentId.TopicIdPartition
    SEGMENT.bytes, b"\x00",     # RemoteLogSegmentId.Id, its tagged fields
    i32(2),                     # BrokerId
    i64(1_700_000_000_789),     # EventTimestampMs
    b"\x00",                    # CustomMetadata: null
    i8(2),                      # RemoteLogSegmentState: DELETE_SEGMENT_STARTED
    b"\x00",                    # tagged fields
])

PARTITION_DELETE_RECORD = b"".join([
    b"\x01", b"\x02", b"\x00",  # frame version 1, api key 2, version 0
    b"\x02" b"t", TOPIC_ID.bytes, i32(3), b"\x00",  # TopicIdPartition
    i32(0),                     # BrokerId
    i64(1_700_000_001_000),     # EventTimestampMs
    i8(0),                      # RemotePartitionDeleteState: DELETE_PARTITION_MARKED
    b"\x00",                    # tagged fields
])

SNAPSHOT_RECORD = b"".join([
    b"\x01", b"\x03", b"\x00",  # frame version 1, api key 3, version 0
    SEGMENT.bytes,              # SegmentId
    i64(0), i64(99),            # StartOffset, EndOffset
    i32(1),                     # BrokerId
    i64(10), i64(20),           # MaxTimestampMs, EventTimestampMs
    b"\x02", i32(0), i64(0), b"\x00",  # SegmentLeaderEpochs: [(0, 0)]
    i32(512),                   # SegmentSizeInBytes
    b"\x00",                    # CustomMetadata: null
    i8(3),                      # RemoteLogSegmentState: DELETE_SEGMENT_FINISHED
    b"\x00",                    # tagged fields
])

TP = wire.TopicIdPartition(TOPIC_ID, "t", 3)
SEGMENT_ENTRY = wire.RemoteLogSegmentIdEntry(TP, SEGMENT)


def segment_metadata(state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(TOPIC_ID, "t", 3, SEGMENT), start_offset=100, end_offset=199,
        max_timestamp_ms=1_700_000_000_123, broker_id=1, event_timestamp_ms=1_700_000_000_456,
        segment_leader_epochs=((5, 100), (7, 150)), size_bytes=4096, state=state)


def test_segment_metadata_record_laid_out_by_hand():
    record = wire.decode(SEGMENT_RECORD)
    assert record == wire.RemoteLogSegmentMetadataRecord(
        segment_id=SEGMENT_ENTRY, start_offset=100, end_offset=199, broker_id=1,
        max_timestamp_ms=1_700_000_000_123, event_timestamp_ms=1_700_000_000_456,
        segment_leader_epochs=((5, 100), (7, 150)), segment_size_in_bytes=4096,
        custom_metadata=b"ab", state=1)
    assert wire.encode(record) == SEGMENT_RECORD


def test_update_record_laid_out_by_hand():
    record = wire.decode(UPDATE_RECORD)
    assert record == wire.RemoteLogSegmentMetadataUpdateRecord(
        segment_id=SEGMENT_ENTRY, broker_id=2, event_timestamp_ms=1_700_000_000_789,
        custom_metadata=None, state=2)
    assert wire.encode(record) == UPDATE_RECORD


def test_partition_delete_record_laid_out_by_hand():
    record = wire.decode(PARTITION_DELETE_RECORD)
    assert record == wire.RemotePartitionDeleteMetadataRecord(TP, 0, 1_700_000_001_000, 0)
    assert wire.encode(record) == PARTITION_DELETE_RECORD


def test_snapshot_record_laid_out_by_hand():
    record = wire.decode(SNAPSHOT_RECORD)
    assert record == wire.RemoteLogSegmentMetadataSnapshotRecord(
        segment_id=SEGMENT, start_offset=0, end_offset=99, broker_id=1, max_timestamp_ms=10,
        event_timestamp_ms=20, segment_leader_epochs=((0, 0),), segment_size_in_bytes=512,
        custom_metadata=None, state=3)
    assert wire.encode(record) == SNAPSHOT_RECORD


def test_segment_metadata_maps_to_the_logs_shape_and_back():
    metadata = deserialize(SEGMENT_RECORD)
    assert metadata == segment_metadata(RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    assert serialize(metadata, custom_metadata=b"ab") == SEGMENT_RECORD


@pytest.mark.parametrize("state", list(RemoteLogSegmentState))
def test_segment_metadata_round_trip(state):
    metadata = segment_metadata(state)
    assert deserialize(serialize(metadata)) == metadata


@pytest.mark.parametrize("custom", [None, b"", b"\x00" * 300])
def test_update_round_trip(custom):
    update = RemoteLogSegmentMetadataUpdate(
        RemoteLogSegmentId(uuid.uuid4(), "topic-é" * 20, 2**31 - 1), -1,
        RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 7, custom)
    assert deserialize(serialize(update)) == update


@pytest.mark.parametrize("state", list(RemotePartitionDeleteState))
def test_partition_delete_round_trip(state):
    delete = RemotePartitionDeleteMetadata(uuid.uuid4(), "orders", 0, state, 123, 4)
    assert deserialize(serialize(delete)) == delete


def test_leader_epochs_come_ascending_one_per_epoch():
    record = wire.decode(SEGMENT_RECORD)
    shuffled = wire.RemoteLogSegmentMetadataRecord(**{
        **{f: getattr(record, f) for f in record.__slots__},
        "segment_leader_epochs": ((7, 150), (5, 100)),
    })
    assert deserialize(wire.encode(shuffled)).segment_leader_epochs == ((5, 100), (7, 150))


def test_unknown_tagged_fields_are_skipped():
    # the record's own tagged fields: one field, tag 9, 3 bytes
    tagged = SEGMENT_RECORD[:-1] + b"\x01\x09\x03xyz"
    assert wire.decode(tagged) == wire.decode(SEGMENT_RECORD)


@pytest.mark.parametrize("value", [SEGMENT_RECORD, UPDATE_RECORD, PARTITION_DELETE_RECORD, SNAPSHOT_RECORD])
def test_every_truncation_is_refused(value):
    for end in range(len(value)):
        with pytest.raises(RemoteLogMetadataError):
            wire.decode(value[:end])


def test_unknown_api_key_is_refused():
    with pytest.raises(RemoteLogMetadataError, match="unknown remote log metadata api key 4"):
        wire.decode(b"\x01\x04\x00" + SEGMENT_RECORD[3:])


def test_unknown_frame_and_message_versions_are_refused():
    with pytest.raises(RemoteLogMetadataError, match="frame version 0"):
        wire.decode(b"\x00" + SEGMENT_RECORD[1:])
    with pytest.raises(RemoteLogMetadataError, match="unsupported version 1"):
        wire.decode(b"\x01\x00\x01" + SEGMENT_RECORD[3:])


def test_bytes_after_the_record_are_refused():
    with pytest.raises(RemoteLogMetadataError, match="1 byte"):
        wire.decode(SEGMENT_RECORD + b"\x00")


def test_null_topic_name_is_refused():
    with pytest.raises(RemoteLogMetadataError, match="null topic name"):
        wire.decode(PARTITION_DELETE_RECORD[:3] + b"\x00" + PARTITION_DELETE_RECORD[5:])


def test_unknown_state_is_refused_by_the_mapping():
    with pytest.raises(RemoteLogMetadataError, match="segment state 9"):
        deserialize(UPDATE_RECORD[:-2] + i8(9) + b"\x00")


def test_snapshot_record_is_not_a_topic_record():
    with pytest.raises(RemoteLogMetadataError, match="not a record of the metadata topic"):
        deserialize(SNAPSHOT_RECORD)


def test_out_of_range_field_is_refused_on_encoding():
    record = wire.decode(UPDATE_RECORD)
    bad = wire.RemoteLogSegmentMetadataUpdateRecord(record.segment_id, 2**31, 0, None, 1)
    with pytest.raises(RemoteLogMetadataError):
        wire.encode(bad)
