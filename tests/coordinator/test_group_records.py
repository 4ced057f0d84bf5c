"""`__consumer_offsets` in Kafka's formats: coordinator partitioning, key/value schemas and
replaying a real log (latest record per key wins, tombstones delete)."""

from __future__ import annotations

import struct

import pytest
from tests.coordinator.coordinator_support import LogReplicaManager

from strom.coordinator import java_string_hash, partition_for
from strom.coordinator.group import records as schema
from strom.coordinator.group.manager import GroupMetadataManager
from strom.coordinator.group.records import GroupMetadataValue, MemberRecord, OffsetAndMetadata
from strom.log import Log
from strom.log.config import LogConfig
from strom.protocol.records import build_batch, build_marker_batch

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("text,expected", [
    ("", 0), ("hello", 99162322), ("Aa", 2112), ("BB", 2112),
    ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE: Kafka's Utils.abs maps it to 0
    ("\U0001F600", 1772899),  # a surrogate pair, as Java's UTF-16 sees it
])
def test_java_string_hash(text, expected):
    assert java_string_hash(text) == expected


def test_partition_for_matches_kafka():
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("x" * 40, 50) == abs(java_string_hash("x" * 40)) % 50


def test_keys_roundtrip_and_match_kafka_layout():
    key = schema.offset_commit_key("g", "topic", 7)
    assert key == struct.pack(">hh", 1, 1) + b"g" + struct.pack(">h", 5) + b"topic" + struct.pack(">i", 7)
    assert schema.read_key(key) == schema.OffsetCommitKey("g", "topic", 7)
    assert schema.read_key(struct.pack(">h", 0) + key[2:]) == schema.OffsetCommitKey("g", "topic", 7)
    assert schema.read_key(schema.group_metadata_key("grp")) == schema.GroupMetadataKey("grp")
    assert schema.read_key(struct.pack(">h", 3) + b"\x00\x01g") == schema.OtherKey(3)


def test_offset_values_all_versions():
    value = OffsetAndMetadata(123, 4, "meta", 1000)
    encoded = schema.offset_commit_value(value)
    assert encoded[:2] == b"\x00\x03" and schema.read_offset_commit_value(encoded) == value
    expiring = OffsetAndMetadata(5, -1, "", 1000, 2000)
    encoded = schema.offset_commit_value(expiring)
    assert encoded[:2] == b"\x00\x01" and schema.read_offset_commit_value(encoded) == expiring
    v0 = struct.pack(">hqh", 0, 9, 2) + b"md" + struct.pack(">q", 77)
    assert schema.read_offset_commit_value(v0) == OffsetAndMetadata(9, -1, "md", 77)
    # v4 is flexible: compact string (length + 1) and a tagged-field section.
    v4 = struct.pack(">hqi", 4, 10, 2) + bytes([3]) + b"ab" + struct.pack(">q", 88) + b"\x00"
    assert schema.read_offset_commit_value(v4) == OffsetAndMetadata(10, 2, "ab", 88)


def test_group_metadata_value_roundtrip_and_v0():
    value = GroupMetadataValue("consumer", 3, "range", "m1", 555, [
        MemberRecord("m1", "inst", "client", "/10.0.0.1", 30000, 10000, b"sub", b"asg"),
        MemberRecord("m2", None, "client", "/10.0.0.2", 30000, 10000, b"", b"")])
    encoded = schema.group_metadata_value(value)
    assert encoded[:2] == b"\x00\x03"
    assert schema.read_group_metadata_value(encoded) == value
    empty = GroupMetadataValue("consumer", 4, None, None, 9)
    assert schema.read_group_metadata_value(schema.group_metadata_value(empty)) == empty

    def s(text: str) -> bytes:
        return struct.pack(">h", len(text)) + text.encode()

    v0 = (struct.pack(">h", 0) + s("consumer") + struct.pack(">i", 2) + s("rr") + s("m") +
          struct.pack(">i", 1) + s("m") + s("c") + s("/h") + struct.pack(">ii", 6000, 1) + b"S" +
          struct.pack(">i", 1) + b"A")
    loaded = schema.read_group_metadata_value(v0)
    assert loaded.members == [MemberRecord("m", None, "c", "/h", 6000, 6000, b"S", b"A")]
    assert (loaded.generation, loaded.protocol, loaded.current_state_timestamp) == (2, "rr", -1)
    with pytest.raises(schema.RecordFormatError):
        schema.read_group_metadata_value(encoded[:-3])


def test_replay_keeps_latest_record_per_key_and_applies_tombstones(tmp_path):
    logs = {p: Log.open(tmp_path / f"__consumer_offsets-{p}", LogConfig()) for p in range(2)}
    manager = GroupMetadataManager(LogReplicaManager("__consumer_offsets", logs), lambda: 2)
    groups = ["alpha", "beta", "gamma"]
    for g in groups:
        manager.store_offsets(g, {("t", 0): OffsetAndMetadata(1, -1, "", 10),
                                  ("t", 1): OffsetAndMetadata(2, -1, "", 10)})
        manager.store_group(GroupMetadataValue("consumer", 1, "range", "m", 10, []), g)
    manager.store_offsets("alpha", {("t", 0): OffsetAndMetadata(50, 3, "later", 20)})
    manager.store_tombstones("beta", [("t", 1)], group=False)
    manager.store_tombstones("gamma", [("t", 0), ("t", 1)], group=True)
    # A record type Strom does not keep (a KIP-848 record, key version 5) is skipped.
    partition = manager.partition_for("alpha")
    logs[partition].append(bytearray(build_batch([(struct.pack(">h", 5) + b"\x00\x01x", b"v")])))
    state = manager.load()
    assert state.offsets["alpha"] == {("t", 0): OffsetAndMetadata(50, 3, "later", 20),
                                      ("t", 1): OffsetAndMetadata(2, -1, "", 10)}
    assert state.offsets["beta"] == {("t", 0): OffsetAndMetadata(1, -1, "", 10)}
    assert state.offsets.get("gamma", {}) == {}
    assert set(state.groups) == {"alpha", "beta"}
    for log in logs.values():
        log.close()


def test_replay_applies_transactional_offsets_only_after_their_commit_marker(tmp_path):
    logs = {0: Log.open(tmp_path / "__consumer_offsets-0", LogConfig())}
    manager = GroupMetadataManager(LogReplicaManager("__consumer_offsets", logs), lambda: 1)
    manager.store_offsets("g", {("t", 0): OffsetAndMetadata(1, -1, "", 10)})
    for pid, offset in ((9, 100), (10, 200), (11, 300)):
        assert manager.store_txn_offsets("g", pid, 0, {("t", 0): OffsetAndMetadata(offset, -1, "", 20)}) == 0
    logs[0].append(bytearray(build_marker_batch(10, 0, False, 0, 30)))  # 10 aborts
    logs[0].append(bytearray(build_marker_batch(9, 0, True, 0, 30)))  # 9 commits
    state = manager.load()
    assert state.offsets["g"][("t", 0)].offset == 100
    assert state.pending_txn_offsets == {11: {"g": {("t", 0): OffsetAndMetadata(300, -1, "", 20)}}}
    logs[0].close()
