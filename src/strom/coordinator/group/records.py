"""The records of `__consumer_offsets`, in Kafka's own key and value schemas.

Every record's key starts with an int16 version that says what the record is:

- 0 and 1: OffsetCommitKey (group, topic, partition) -> OffsetCommitValue
- 2: GroupMetadataKey (group) -> GroupMetadataValue
- 3 and up: records of KIP-848 consumer groups (and share/streams groups); Strom keeps the
  state of those groups in memory only, so the loader skips them.

A null value is a tombstone: the offset, or the whole group, was deleted. Strom writes the
versions Kafka 3.x writes (offset key v1, offset value v3 or v1 when an expire timestamp is
set, group key v2, group value v3) and reads every version up to the flexible v4 values, so
a log written by Kafka loads here and the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strom.protocol.record_schema import Reader, RecordFormatError, Writer

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_EXPIRE = 1  # the only version with an expire timestamp
GROUP_METADATA_VALUE_VERSION = 3


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OtherKey:
    """A record type Strom does not keep (KIP-848 and later group types)."""

    version: int


@dataclass(slots=True)
class OffsetAndMetadata:
    """A committed offset as the coordinator keeps it and the log stores it."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int | None = None  # only commits of OffsetCommit v2-v4 with a retention


@dataclass(slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: list[MemberRecord] = field(default_factory=list)


# --- writing (non-flexible versions only: those are what Kafka 3.x writes) -----------------------
def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    w = Writer().int16(OFFSET_COMMIT_KEY_VERSION).string(group).string(topic).int32(partition)
    return bytes(w.buf)


def group_metadata_key(group: str) -> bytes:
    return bytes(Writer().int16(GROUP_METADATA_KEY_VERSION).string(group).buf)


def offset_commit_value(value: OffsetAndMetadata) -> bytes:
    if value.expire_timestamp is not None:
        w = Writer().int16(OFFSET_COMMIT_VALUE_VERSION_EXPIRE).int64(value.offset)
        w.string(value.metadata).int64(value.commit_timestamp).int64(value.expire_timestamp)
    else:
        w = Writer().int16(OFFSET_COMMIT_VALUE_VERSION).int64(value.offset).int32(value.leader_epoch)
        w.string(value.metadata).int64(value.commit_timestamp)
    return bytes(w.buf)


def group_metadata_value(value: GroupMetadataValue) -> bytes:
    w = Writer().int16(GROUP_METADATA_VALUE_VERSION)
    w.string(value.protocol_type).int32(value.generation).string(value.protocol).string(value.leader)
    w.int64(value.current_state_timestamp).int32(len(value.members))
    for m in value.members:
        w.string(m.member_id).string(m.group_instance_id).string(m.client_id).string(m.client_host)
        w.int32(m.rebalance_timeout).int32(m.session_timeout).bytes_(m.subscription).bytes_(m.assignment)
    return bytes(w.buf)


# --- reading (every version, flexible ones included) ---------------------------------------------
def read_key(key: bytes) -> OffsetCommitKey | GroupMetadataKey | OtherKey:
    r = Reader(key)
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string() or "", r.string() or "", r.int32())
    if version == 2:
        return GroupMetadataKey(r.string() or "")
    return OtherKey(version)


def read_offset_commit_value(value: bytes) -> OffsetAndMetadata:
    r = Reader(value)
    version = r.int16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown offset commit value version {version}")
    r.flexible = version >= 4
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string() or ""
    commit_timestamp = r.int64()
    expire = r.int64() if version == 1 else -1
    r.tagged_fields()
    return OffsetAndMetadata(offset, leader_epoch, metadata, commit_timestamp,
                             expire if expire != -1 else None)


def read_group_metadata_value(value: bytes) -> GroupMetadataValue:
    r = Reader(value)
    version = r.int16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unknown group metadata value version {version}")
    r.flexible = version >= 4
    group = GroupMetadataValue(r.string() or "", r.int32(), r.string(), r.string())
    if version >= 2:
        group.current_state_timestamp = r.int64()
    for _ in range(max(r.array_length(), 0)):
        member_id = r.string() or ""
        instance_id = r.string() if version >= 3 else None
        client_id, client_host = r.string() or "", r.string() or ""
        rebalance_timeout = r.int32() if version >= 1 else -1
        session_timeout = r.int32()
        subscription, assignment = r.bytes_() or b"", r.bytes_() or b""
        r.tagged_fields()
        if rebalance_timeout == -1:
            rebalance_timeout = session_timeout  # v0 had one timeout for both
        group.members.append(MemberRecord(member_id, instance_id, client_id, client_host,
                                          rebalance_timeout, session_timeout, subscription, assignment))
    r.tagged_fields()
    return group


# --- share groups (KIP-932): Kafka's ShareGroup* records -----------------------------------------
# The key's int16 version is the record type, as Kafka's coordinator records have it; keys are
# non-flexible, values flexible version 0.
SHARE_GROUP_MEMBER_METADATA = 10
SHARE_GROUP_METADATA = 11
SHARE_GROUP_TARGET_ASSIGNMENT_METADATA = 12
SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER = 13
SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT = 14
SHARE_GROUP_RECORD_TYPES = frozenset(range(SHARE_GROUP_MEMBER_METADATA, SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT + 1))
_PER_MEMBER = frozenset({SHARE_GROUP_MEMBER_METADATA, SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
                         SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT})
ShareAssignment = dict  # topic id -> set of partitions


@dataclass(frozen=True, slots=True)
class ShareGroupKey:
    """The key of a share group record: its type, the group, and the member for member records."""

    record_type: int
    group: str
    member: str | None = None


def share_group_key(key: ShareGroupKey) -> bytes:
    w = Writer().int16(key.record_type).string(key.group)
    if key.record_type in _PER_MEMBER:
        w.string(key.member or "")
    return bytes(w.buf)


def read_share_group_key(data: bytes) -> ShareGroupKey | None:
    """A share group record's key, or None for any other record."""
    r = Reader(data)
    record_type = r.int16()
    if record_type not in SHARE_GROUP_RECORD_TYPES:
        return None
    group = r.string() or ""
    return ShareGroupKey(record_type, group, (r.string() or "") if record_type in _PER_MEMBER else None)


def _value() -> Writer:
    return Writer(flexible=True).int16(0)


def _partitions(w: Writer, assignment: ShareAssignment) -> None:
    w.array_length(len(assignment))
    for topic_id in sorted(assignment, key=str):
        w.uuid(topic_id).array_length(len(assignment[topic_id]))
        for p in sorted(assignment[topic_id]):
            w.int32(p)
        w.tagged_fields()


def _read_partitions(r: Reader) -> ShareAssignment:
    out: ShareAssignment = {}
    for _ in range(max(r.array_length(), 0)):
        topic_id = r.uuid()
        out[topic_id] = {r.int32() for _ in range(max(r.array_length(), 0))}
        r.tagged_fields()
    return out


def share_group_epoch_value(epoch: int) -> bytes:
    """ShareGroupMetadataValue (the group epoch) or ShareGroupTargetAssignmentMetadataValue
    (the assignment epoch): both one int32."""
    return bytes(_value().int32(epoch).tagged_fields().buf)


def share_member_metadata_value(rack_id: str | None, client_id: str, client_host: str,
                                subscribed: list[str]) -> bytes:
    w = _value().string(rack_id).string(client_id).string(client_host).array_length(len(subscribed))
    for name in sorted(subscribed):
        w.string(name)
    return bytes(w.tagged_fields().buf)


def share_target_member_value(assignment: ShareAssignment) -> bytes:
    w = _value()
    _partitions(w, assignment)
    return bytes(w.tagged_fields().buf)


def share_current_assignment_value(member_epoch: int, previous_epoch: int, assignment: ShareAssignment) -> bytes:
    w = _value().int32(member_epoch).int32(previous_epoch).int8(0)  # state 0: stable
    _partitions(w, assignment)
    return bytes(w.tagged_fields().buf)


@dataclass(slots=True)
class ShareMemberRecord:
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed: list[str]


def read_share_group_value(record_type: int, data: bytes):
    """The value of a share group record: an int (group or assignment epoch), a
    ShareMemberRecord, a ShareAssignment (target), or (member epoch, ShareAssignment)."""
    r = Reader(data, flexible=True)
    version = r.int16()
    if version != 0:
        raise RecordFormatError(f"unknown share group record value version {version}")
    if record_type in (SHARE_GROUP_METADATA, SHARE_GROUP_TARGET_ASSIGNMENT_METADATA):
        return r.int32()
    if record_type == SHARE_GROUP_MEMBER_METADATA:
        rack, client_id, host = r.string(), r.string() or "", r.string() or ""
        return ShareMemberRecord(rack, client_id, host, [r.string() or "" for _ in range(max(r.array_length(), 0))])
    if record_type == SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER:
        return _read_partitions(r)
    member_epoch = r.int32()
    r.int32()  # the previous member epoch
    r.int8()  # the member state
    return member_epoch, _read_partitions(r)
