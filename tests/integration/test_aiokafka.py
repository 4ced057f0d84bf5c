"""aiokafka: AIOKafkaProducer and AIOKafkaConsumer (assign + seek, group_id=None)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from strom.testing import create_topic

from .conftest import stored_batches

pytestmark = pytest.mark.timeout(60)

T0 = 1_650_000_000_000


async def consume(bootstrap: str, topic: str, partition: int, offset: int, n: int) -> list:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        out: list = []
        async with asyncio.timeout(20):
            while len(out) < n:
                for records in (await consumer.getmany(tp, timeout_ms=200)).values():
                    out.extend(records)
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_send_and_wait_roundtrip_with_headers(broker, topic, codec):
    create_topic(broker.bootstrap, topic, partitions=2)

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", compression_type=codec)
        await producer.start()
        try:
            sent = [await producer.send_and_wait(topic, b"aio-%d" % i, key=b"key-%d" % i, partition=i % 2,
                                                 timestamp_ms=T0 + i, headers=[("trace", b"t%d" % i)])
                    for i in range(10)]
        finally:
            await producer.stop()
        return sent, [await consume(broker.bootstrap, topic, p, 0, 5) for p in (0, 1)]

    sent, (part0, part1) = asyncio.run(run())
    assert [(m.partition, m.offset) for m in sent] == [(i % 2, i // 2) for i in range(10)]
    for p, got in ((0, part0), (1, part1)):
        assert [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in got] == [
            (i // 2, b"key-%d" % i, b"aio-%d" % i, T0 + i, [("trace", b"t%d" % i)]) for i in range(p, 10, 2)]


def test_batched_sends_and_seek_into_a_batch(broker, topic):
    create_topic(broker.bootstrap, topic)

    async def run():
        # One batch, built explicitly (a linger would make it depend on the machine's speed).
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            batch = producer.create_batch()
            for i in range(40):
                assert batch.append(key=None, value=b"b-%d" % i, timestamp=None) is not None
            sent = await (await producer.send_batch(batch, topic, partition=0))
        finally:
            await producer.stop()
        return sent, await consume(broker.bootstrap, topic, 0, 25, 15)

    sent, got = asyncio.run(run())
    assert (sent.partition, sent.offset) == (0, 0)
    [stored] = stored_batches(broker.bootstrap, topic, 0)
    assert (stored.base_offset, stored.record_count) == (0, 40)
    assert [(r.offset, r.value) for r in got] == [(i, b"b-%d" % i) for i in range(25, 40)]
