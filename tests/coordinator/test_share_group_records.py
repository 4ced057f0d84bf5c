"""Share group records of `__consumer_offsets` (Kafka's ShareGroup* key and value schemas):
the bytes Kafka's schemas give, and what reading them back gives."""

from __future__ import annotations

import uuid

import pytest

from strom.coordinator.group import records as r
from strom.protocol.record_schema import RecordFormatError

TOPIC = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")


def test_keys_carry_the_record_type_and_member_records_the_member():
    group_key = r.share_group_key(r.ShareGroupKey(r.SHARE_GROUP_METADATA, "g"))
    assert group_key == b"\x00\x0b\x00\x01g"  # int16 type 11, then the group as a non-flexible string
    member_key = r.share_group_key(r.ShareGroupKey(r.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT, "g", "m"))
    assert member_key == b"\x00\x0e\x00\x01g\x00\x01m"
    assert r.read_share_group_key(member_key) == r.ShareGroupKey(r.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT, "g", "m")
    assert r.read_share_group_key(group_key) == r.ShareGroupKey(r.SHARE_GROUP_METADATA, "g")
    # Other records of the topic are not share group records.
    assert r.read_share_group_key(r.offset_commit_key("g", "t", 0)) is None
    assert r.read_share_group_key(r.group_metadata_key("g")) is None


def test_values_are_flexible_version_0_and_read_back():
    assert r.share_group_epoch_value(7) == b"\x00\x00" + (7).to_bytes(4, "big") + b"\x00"
    assert r.read_share_group_value(r.SHARE_GROUP_METADATA, r.share_group_epoch_value(7)) == 7
    member = r.read_share_group_value(r.SHARE_GROUP_MEMBER_METADATA,
                                      r.share_member_metadata_value(None, "client", "/1.2.3.4", ["b", "a"]))
    assert member == r.ShareMemberRecord(None, "client", "/1.2.3.4", ["a", "b"])
    assignment = {TOPIC: {2, 0}}
    assert r.read_share_group_value(r.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
                                    r.share_target_member_value(assignment)) == {TOPIC: {0, 2}}
    assert r.read_share_group_value(r.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
                                    r.share_current_assignment_value(5, 5, assignment)) == (5, {TOPIC: {0, 2}})


def test_an_unknown_value_version_is_refused():
    with pytest.raises(RecordFormatError):
        r.read_share_group_value(r.SHARE_GROUP_METADATA, b"\x00\x01\x00\x00\x00\x07\x00")
