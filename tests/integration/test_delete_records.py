"""DeleteRecords through confluent-kafka's AdminClient: the log start offset moves, ListOffsets
earliest and consumers from the beginning follow it, and it survives kill -9."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from strom.testing import create_topic, wait_for

from .conftest import Rec, admin, ck_consume, ck_produce, watermarks, wire_call

pytestmark = pytest.mark.timeout(60)


def delete_records(bootstrap: str, topic: str, partition: int, offset: int):
    """The DeletedRecords result, or the KafkaError the broker answered."""
    tp = TopicPartition(topic, partition, offset)
    client = admin(bootstrap)  # must outlive the future
    try:
        return client.delete_records([tp], operation_timeout=10)[tp].result(timeout=15)
    except KafkaException as e:
        return e.args[0]


def earliest(bootstrap: str, topic: str, partition: int) -> int:
    tp = TopicPartition(topic, partition)
    client = admin(bootstrap)
    return client.list_offsets({tp: OffsetSpec.earliest()})[tp].result(timeout=15).offset


def test_delete_records_moves_the_log_start(retention_broker, topic):
    bootstrap = retention_broker.bootstrap
    create_topic(bootstrap, topic, partitions=2, config={"segment.bytes": "1024"})
    ck_produce(bootstrap, topic, [Rec(b"value-%03d" % i, partition=0) for i in range(100)],
               **{"linger.ms": 0, "batch.num.messages": 4})
    ck_produce(bootstrap, topic, [Rec(b"other", partition=1)])
    segments = sorted((retention_broker.data_dir / "logs" / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 3

    assert delete_records(bootstrap, topic, 0, 42).low_watermark == 42
    assert earliest(bootstrap, topic, 0) == 42
    assert watermarks(bootstrap, topic, 0) == (42, 100)
    assert watermarks(bootstrap, topic, 1) == (0, 1)  # other partitions are untouched
    # A consumer from the beginning starts at the new log start ...
    got = ck_consume(bootstrap, [(topic, 0, OFFSET_BEGINNING)], 58)
    assert [m.offset() for m in got] == list(range(42, 100))
    assert [m.value() for m in got] == [b"value-%03d" % i for i in range(42, 100)]
    # ... and one at a deleted offset is reset there.
    got = ck_consume(bootstrap, [(topic, 0, 10)], 58, **{"auto.offset.reset": "earliest"})
    assert got[0].offset() == 42
    # Segments wholly below the log start go at the next retention run.
    wait_for(lambda: segments[0].name not in {p.name for p in segments[0].parent.glob("*.log")},
             timeout=10, what="segments below the log start to be deleted")

    # Lower offsets change nothing; the high watermark is the limit; -1 means up to it.
    assert delete_records(bootstrap, topic, 0, 5).low_watermark == 42
    assert delete_records(bootstrap, topic, 0, 101).code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert delete_records(bootstrap, topic, 0, OFFSET_END).low_watermark == 100
    assert earliest(bootstrap, topic, 0) == 100
    # (the client refuses unknown partitions itself: ask on the wire)
    body = wire_call(bootstrap, 21, 2, {"topics": [{"name": topic, "partitions": [
        {"partition_index": 7, "offset": 1}]}], "timeout_ms": 1000})
    assert body.topics[0].partitions[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PART

    # The new log start is checkpointed before the answer: kill -9 does not bring records back.
    retention_broker.kill()
    retention_broker.start()
    assert watermarks(bootstrap, topic, 0) == (100, 100)
    assert earliest(bootstrap, topic, 0) == 100
    assert [m.offset() for m in ck_produce(bootstrap, topic, [Rec(b"after", partition=0)])] == [100]
