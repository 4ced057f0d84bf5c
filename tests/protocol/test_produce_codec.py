"""The hand-written ProduceResponse encoder against the schema codec, every version."""

from __future__ import annotations

import uuid

import pytest

from strom.protocol import messages
from strom.protocol.produce import PartitionProduceResponse, encode_produce_response

PRODUCE = 0


def _partitions() -> list[PartitionProduceResponse]:
    return [
        PartitionProduceResponse(0, 0, 42, -1, 0),
        PartitionProduceResponse(7, 87, -1, 1_700_000_000_000, 5, [(3, "bad timestamp"), (9, None)],
                                 "One or more records have been rejected"),
        PartitionProduceResponse(2, 6, -1, -1, -1, [], None),
    ]


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_response_matches_the_schema(version):
    ids = [uuid.uuid4(), uuid.uuid4()]
    names = ["orders", "ünïcode-topic"]
    topics = [(ids[i] if version >= 13 else names[i], _partitions()[i:]) for i in range(2)]
    body, throttle_at = encode_produce_response(topics, version, throttle_time_ms=250)
    decoded = messages.RESPONSES[PRODUCE].decode(memoryview(body), version=version)
    assert decoded.throttle_time_ms == 250
    assert body[throttle_at:throttle_at + 4] == (250).to_bytes(4, "big")
    assert len(decoded.responses) == 2
    for (topic, partitions), got in zip(topics, decoded.responses, strict=True):
        if version >= 13:
            assert got.topic_id == topic
        else:
            assert got.name == topic
        assert len(got.partition_responses) == len(partitions)
        for want, p in zip(partitions, got.partition_responses, strict=True):
            assert (p.index, p.error_code, p.base_offset, p.log_append_time_ms) == (
                want.index, want.error_code, want.base_offset, want.log_append_time_ms)
            if version >= 5:
                assert p.log_start_offset == want.log_start_offset
            if version >= 8:
                assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == \
                    list(want.record_errors or [])
                assert p.error_message == want.error_message
    # and byte for byte what the codec writes from the same fields
    fields = {"throttle_time_ms": 250, "responses": [
        {("topic_id" if version >= 13 else "name"): topic, "partition_responses": [
            {"index": p.index, "error_code": p.error_code, "base_offset": p.base_offset,
             "log_append_time_ms": p.log_append_time_ms, "log_start_offset": p.log_start_offset,
             "record_errors": [{"batch_index": i, "batch_index_error_message": m} for i, m in p.record_errors or []],
             "error_message": p.error_message} for p in partitions]}
        for topic, partitions in topics]}
    assert body == messages.encode_body(PRODUCE, version, fields)
